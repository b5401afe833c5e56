"""Put every package root of the one `qshare` distribution on the venv's path.

setuptools' editable finder only knows the packages that existed at install time; a
.pth file with the roots makes packages added later importable without reinstalling.
"""

import sysconfig
import tomllib
from pathlib import Path


def package_roots(top: Path) -> list[str]:
    """The roots pyproject.toml's `packages.find` searches (one source for both)."""
    project = tomllib.loads((top / "pyproject.toml").read_text())
    roots: list[str] = project["tool"]["setuptools"]["packages"]["find"]["where"]
    return roots


def main() -> None:
    top = Path(__file__).resolve().parents[2]
    site = Path(sysconfig.get_paths()["purelib"])
    lines = [str(top / root) for root in package_roots(top)]
    (site / "qshare-roots.pth").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
