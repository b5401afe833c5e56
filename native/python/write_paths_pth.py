"""Put every package root of the one `qshare` distribution on the venv's path.

setuptools' editable finder only knows the packages that existed at install time; a
.pth file with the roots makes packages added later importable without reinstalling.
"""

import sysconfig
from pathlib import Path

ROOTS = (
    "services/common",
    "services/api",
    "services/allocator",
    "services/node-agent",
    "services/preemptor",
    "native/python",
)


def main() -> None:
    top = Path(__file__).resolve().parents[2]
    site = Path(sysconfig.get_paths()["purelib"])
    lines = [str(top / root) for root in ROOTS]
    (site / "qshare-roots.pth").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
