"""Every QSHARE_ variable the documents, the compose stack, the Kubernetes manifests and the
Dockerfile name is one the code reads. The settings classes ignore variables they do not
know (`extra="ignore"`), so a misspelt or renamed one would be dropped without a word: a
service's variable (`QSHARE_API_…`, `QSHARE_NODE_…`, …) must be a field of a settings
class, and any other one must be named by the sources (read with getenv or os.environ)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from qshare.envsettings import env_names

ROOT = Path(__file__).parents[2]
PACKAGES = ("qshare", "qshare_api", "qshare_allocator", "qshare_preemptor", "qshare_node_agent")
SERVICE_PREFIXES = tuple(
    f"QSHARE_{p}_" for p in ("API", "ALLOCATOR", "PREEMPTOR", "NODE", "K8S", "EXTENDER")
)
"""The variables of a service's settings class (env_prefix)."""
NAME = re.compile(r"\bQSHARE_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_*])")
"""A whole variable's name (`QSHARE_NODE_*`, a family, is left out)."""
WHERE = [
    ROOT / "README.md",
    ROOT / "Dockerfile",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "compose").rglob("*.y*ml")),
    *sorted((ROOT / "deploy").rglob("*.y*ml")),
]
SOURCES = [
    p
    for pattern in ("services/**/*.py", "native/**/*.c", "native/**/*.h", "native/**/*.py")
    for p in ROOT.glob(pattern)
    if "tests" not in p.relative_to(ROOT).parts
]


def _settings_classes() -> set[type[BaseSettings]]:
    found: set[type[BaseSettings]] = set()
    for root in PACKAGES:
        package = importlib.import_module(root)
        for info in pkgutil.walk_packages(package.__path__, f"{root}."):
            if ".bench" in info.name or ".testing" in info.name:
                continue
            module = importlib.import_module(info.name)
            found |= {
                v
                for v in vars(module).values()
                if isinstance(v, type) and issubclass(v, BaseSettings) and v is not BaseSettings
            }
    return found


def _read_by_settings() -> set[str]:
    return {
        name.upper()
        for cls in _settings_classes()
        for field in cls.model_fields
        for name in env_names(cls, field)
    }


def _named_in_sources() -> set[str]:
    quoted = re.compile(r"[\"'](QSHARE_[A-Z0-9_]+)[\"']")
    return {m for p in SOURCES for m in quoted.findall(p.read_text(errors="replace"))}


@pytest.fixture(scope="module")
def known() -> tuple[set[str], set[str]]:
    return _read_by_settings(), _named_in_sources()


@pytest.mark.parametrize("where", WHERE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_variable_named_is_one_the_code_reads(
    where: Path, known: tuple[set[str], set[str]]
) -> None:
    settings, sources = known
    unknown = []
    for name in sorted(set(NAME.findall(where.read_text()))):
        if name.startswith(SERVICE_PREFIXES):
            if name not in settings:
                unknown.append(f"{name} (no settings class reads it)")
        elif name not in settings | sources:
            unknown.append(f"{name} (no settings class or source reads it)")
    assert unknown == [], f"{where.relative_to(ROOT)}: {', '.join(unknown)}"
