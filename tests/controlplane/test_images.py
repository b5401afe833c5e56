"""The images' Dockerfiles (no Docker engine here: each image's files are laid out as its
COPY lines put them): an image that migrates finds alembic.ini and the migrations where its
QSHARE_ALEMBIC_INI says, one that builds the driver has the Makefile it runs, and the one
image the Kubernetes manifests run carries what each of their containers uses."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from alembic.config import Config
from alembic.script import ScriptDirectory

from qshare_allocator.migrate import head

ROOT = Path(__file__).parents[2]
KUBERNETES_IMAGE = ROOT / "deploy" / "Dockerfile"
COMPOSE = ROOT / "compose" / "docker-compose.yml"


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments left out."""
    lines = [ln for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    found = [line.strip().split(None, 1) for line in joined.splitlines() if line.strip()]
    return [(parts[0].upper(), parts[1] if len(parts) > 1 else "") for parts in found]


def _laid_out(dockerfile: Path, into: Path) -> Path:
    """The repository's files copied into `into` as the Dockerfile's COPY lines put them;
    the image's WORKDIR (under `into`)."""
    workdir = Path("/")
    for instruction, args in _instructions(dockerfile):
        if instruction == "WORKDIR":
            workdir = workdir / args
        elif instruction == "COPY":
            *sources, dest = shlex.split(args)
            _copy(sources, into / (workdir / dest).relative_to("/"), dest.endswith("/"))
    return into / workdir.relative_to("/")


def _copy(sources: list[str], dest: Path, into_dir: bool) -> None:
    for source in sources:
        target = dest / Path(source).name if into_dir or len(sources) > 1 else dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(ROOT / source, target)


def _env(dockerfile: Path) -> dict[str, str]:
    pairs = [p for i, args in _instructions(dockerfile) if i == "ENV" for p in shlex.split(args)]
    return dict(pair.split("=", 1) for pair in pairs)


def _compose_migrations() -> list[Path]:
    """The Dockerfiles of the compose services that run `migrate`."""
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return [
        COMPOSE.parent / s["build"]["context"] / s["build"]["dockerfile"]
        for s in services.values()
        if s.get("command") == ["migrate"]
    ]


MIGRATING = sorted({*_compose_migrations(), KUBERNETES_IMAGE}, key=str)
BUILDING_THE_DRIVER = [ROOT / "services" / "node-agent" / "Dockerfile", KUBERNETES_IMAGE]


@pytest.mark.parametrize("dockerfile", MIGRATING, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_image_that_migrates_finds_the_migrations_head(
    dockerfile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = tmp_path / "image"
    _laid_out(dockerfile, image)
    ini = _env(dockerfile)["QSHARE_ALEMBIC_INI"]
    monkeypatch.setenv("QSHARE_ALEMBIC_INI", str(image / Path(ini).relative_to("/")))
    expected = ScriptDirectory.from_config(Config(str(ROOT / "alembic.ini"))).get_current_head()
    assert head("postgresql+asyncpg://u@db/q") == expected


@pytest.mark.parametrize("dockerfile", BUILDING_THE_DRIVER, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_image_that_builds_the_driver_has_the_makefile_it_runs(
    dockerfile: Path, tmp_path: Path
) -> None:
    workdir = _laid_out(dockerfile, tmp_path / "image")
    dry_run = subprocess.run(
        ["make", "-n", "-B", "-C", str(workdir), "native", "PY=python", "VENV=/usr/local",
         "STAMP=/dev/null"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert dry_run.returncode == 0, dry_run.stderr
    assert "build_ffi.py" in dry_run.stdout, "make would not build the driver"  # not "native/"


@pytest.mark.parametrize("dockerfile", BUILDING_THE_DRIVER, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_image_that_builds_the_driver_imports_the_module_it_built(dockerfile: Path) -> None:
    """The cffi module is built into native/python after the install: only an editable
    install imports it from there (a copy in site-packages would not have it)."""
    installs = [a for i, a in _instructions(dockerfile) if i == "RUN" and "pip install" in a]
    assert installs and all(" -e " in a for a in installs)


def _manifest_containers() -> list[dict[str, Any]]:
    base = ROOT / "deploy" / "kubernetes" / "base"
    docs = [d for f in sorted(base.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    pods = [d["spec"]["template"]["spec"] for d in docs if d and d.get("kind") in WORKLOADS]
    every = [c for pod in pods for c in pod.get("initContainers", []) + pod["containers"]]
    return [c for c in every if c["image"] == "qshare"]


WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet"}


def test_the_kubernetes_image_ships_what_its_containers_copy_out() -> None:
    copied = [c["command"][1] for c in _manifest_containers() if c["command"][0] == "cp"]
    shipped = [a for i, a in _instructions(KUBERNETES_IMAGE) if i == "RUN"]
    libraries = [path for path in copied if path.startswith("/usr/lib/")]
    assert libraries
    assert all(any(path in run for run in shipped) for path in libraries)


def test_the_kubernetes_image_has_every_module_its_containers_run(tmp_path: Path) -> None:
    workdir = _laid_out(KUBERNETES_IMAGE, tmp_path / "image")
    run = [c["command"] for c in _manifest_containers()]
    modules = {command[2] for command in run if command[:2] == ["python", "-m"]}
    assert modules
    packages = {p.name for p in (workdir / "services").glob("*/qshare_*")}
    assert modules <= packages
