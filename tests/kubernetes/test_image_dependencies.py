"""What the services import is installed with them: every third-party module imported by
the packages the image installs (bench and test helpers aside, which need the dev extras)
comes from a runtime dependency of pyproject.toml (or the `gpu` extra the image adds), or
from a dependency of one. The image test runs commands with the development venv's packages
beside the image's, so it cannot see a module only the dev extras bring."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).parents[2]
SOURCES = [*ROOT.glob("services/*/qshare*/**/*.py"), *ROOT.glob("native/python/**/*.py")]
DEV_ONLY = {"bench", "testing"}
"""Directories of modules only the benchmarks and the tests run (the dev extras)."""
NOT_INSTALLED_HERE = {"pynvml": "nvidia-ml-py"}
"""Modules of the `gpu` extra, absent from a development venv without a GPU."""


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _installed_with(names: set[str]) -> set[str]:
    """`names` and everything their installs pull in (requirements without an extra)."""
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r.replace("extra==", "extra ==")]
    return found


def _runtime() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    given = project["dependencies"] + project["optional-dependencies"]["gpu"]
    return _installed_with({_name(r) for r in given})


def _imports(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return {t for t in tops if t not in sys.stdlib_module_names and not t.startswith("qshare")}


def test_every_module_the_services_import_is_installed_by_their_dependencies() -> None:
    runtime, owners = _runtime(), metadata.packages_distributions()
    missing = []
    for path in SOURCES:
        if DEV_ONLY & set(path.relative_to(ROOT).parts) or path.name == "build_ffi.py":
            continue
        for module in sorted(_imports(path) - {"_cffi_backend"}):
            dists = owners.get(module) or [NOT_INSTALLED_HERE.get(module, module)]
            if not {_name(d) for d in dists} & runtime:
                missing.append(f"{path.relative_to(ROOT)}: {module} ({', '.join(dists)})")
    assert missing == [], "imported, but only a dev extra installs it:\n" + "\n".join(missing)
