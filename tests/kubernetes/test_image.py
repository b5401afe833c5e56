"""The one container image (the root Dockerfile) holds what the Kubernetes manifests and
the compose stack run. No Docker
engine runs here, so its build is replayed: the Dockerfile's COPY lines into a scratch
tree, its `make image-install` into a scratch root, then each manifest's command runs
from that root with an interpreter that sees only the image's packages and their
dependencies (not the repository's sources, as the development venv does)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from qshare_allocator.migrate import head

from .test_manifests import all_objects

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose" / "docker-compose.yml"
LEFT_OUT = shutil.ignore_patterns("__pycache__", "build", "*.so", "*.egg-info", "*.pyc")


@dataclass(frozen=True)
class Stage:
    workdir: str
    copies: list[tuple[list[str], str]]
    env: dict[str, str]
    run: list[str]


@dataclass(frozen=True)
class Image:
    root: Path
    python: Path
    env: dict[str, str]

    def run(
        self, *args: str, extra: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ["PATH"], **self.env, **(extra or {})}
        return subprocess.run(
            [str(self.python), *args],
            cwd=self.root / "app",
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    joined = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line and line[0] != "#")
    ]


def stages() -> list[Stage]:
    found: list[Stage] = []
    for word, args in instructions():
        if word == "FROM":
            found.append(Stage("/", [], {}, []))
        elif word == "WORKDIR":
            found[-1] = Stage(args, found[-1].copies, found[-1].env, found[-1].run)
        elif word == "COPY" and not args.startswith("--from"):
            *sources, dest = args.split()
            found[-1].copies.append((sources, dest))
        elif word == "ENV":
            found[-1].env.update(pair.split("=", 1) for pair in shlex.split(args))
        elif word == "RUN":
            found[-1].run.append(args)
    return found


def copy_into(stage: Stage, top: Path) -> None:
    """The stage's COPY lines from the repository into `top`, the image's `/`."""
    for sources, dest in stage.copies:
        target = top / stage.workdir.lstrip("/") / dest
        for source in sources:
            path = ROOT / source
            if path.is_dir():
                shutil.copytree(path, target, ignore=LEFT_OUT)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)


def make_arguments(stage: Stage) -> list[str]:
    """The `make image-install ...` of the build stage's RUN, as arguments."""
    [command] = [c for run in stage.run for c in run.split("&&") if "make image-install" in c]
    return shlex.split(command.strip())[1:]


def interpreter(base: Path, image_site: Path) -> Path:
    """A venv that sees the image's packages first, then the development venv's third-party
    packages (a path, so its .pth files, which put our sources on the path, are not read)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    [site] = (base / "venv").glob("lib/python*/site-packages")
    deps = sysconfig.get_paths()["purelib"]
    (site / "image.pth").write_text(f"{image_site}\n{deps}\n")
    return base / "venv" / "bin" / "python"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    build, runtime = stages()
    base = tmp_path_factory.mktemp("image")
    copy_into(build, base / "build")
    arguments = [a for a in make_arguments(build) if not a.startswith(("PYTHON=", "IMAGE_ROOT="))]
    subprocess.run(
        [
            "make",
            "-s",
            *arguments,
            f"PYTHON={sys.executable}",
            f"IMAGE_ROOT={base / 'root'}",
            "PIP_FLAGS=--no-deps --no-build-isolation",
        ],
        cwd=base / "build" / build.workdir.lstrip("/"),
        check=True,
        capture_output=True,
    )
    copy_into(runtime, base / "root")
    [image_site] = {p.parent for p in (base / "root").rglob("site-packages/qshare_driver")}
    env = {k: str(base / "root") + v if v.startswith("/") else v for k, v in runtime.env.items()}
    return Image(base / "root", interpreter(base, image_site), env)


def manifest_commands() -> list[list[str]]:
    """The command of every container and init container of the manifests' workloads."""
    commands = []
    for obj in all_objects():
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            commands.append(container.get("command", []))
    return commands


def compose_services() -> dict[str, dict[str, Any]]:
    """The compose services built from this repository (the others are upstream images)."""
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    return {name: s for name, s in services.items() if "build" in s}


def compose_commands() -> list[list[str]]:
    return [s.get("entrypoint", []) + s.get("command", []) for s in compose_services().values()]


def python_modules(commands: list[list[str]]) -> set[str]:
    """Every MODULE of `python -m MODULE ...` among `commands`."""
    return {c[2] for c in commands if c[:2] == ["python", "-m"]}


def test_the_manifests_run_every_service_from_the_one_image() -> None:
    services = {"qshare_allocator", "qshare_api", "qshare_node_agent", "qshare_preemptor"}
    assert python_modules(manifest_commands()) == services


def test_compose_builds_every_qshare_service_from_the_one_image() -> None:
    builds = {
        (s["build"]["context"], s["build"]["dockerfile"]) for s in compose_services().values()
    }
    assert builds == {("..", "Dockerfile")}
    assert all(c[:2] == ["python", "-m"] for c in compose_commands())


@pytest.mark.parametrize("module", sorted(python_modules(manifest_commands() + compose_commands())))
def test_every_module_the_manifests_and_compose_run_starts_from_the_image(
    image: Image, module: str
) -> None:
    done = image.run("-m", module, "--help")
    assert done.returncode == 0, done.stderr
    assert f"python -m {module}" in done.stdout


def test_the_image_carries_the_drivers_native_module(image: Image) -> None:
    done = image.run("-c", "import qshare_driver._ffi as m; print(m.__file__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(image.root))


def node_agent_pod() -> dict[str, Any]:
    [agent] = [
        o
        for o in all_objects()
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "qshare-node-agent"
    ]
    pod: dict[str, Any] = agent["spec"]["template"]["spec"]
    return pod


def test_the_interposer_is_where_the_node_agents_init_container_copies_it_from(
    image: Image,
) -> None:
    commands = [c["command"] for c in node_agent_pod()["initContainers"]]
    [source] = [c[1] for c in commands if c[0] == "cp" and c[1].endswith("libqshare-cuda.so")]
    assert (image.root / source.lstrip("/")).read_bytes()[:4] == b"\x7fELF"


async def test_the_allocators_init_container_migrates_an_empty_database_from_the_image(
    image: Image, database_url: str
) -> None:
    name = f"qshare_image_{os.getpid()}"
    admin = create_async_engine(database_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        await conn.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(database_url).set(database=name).render_as_string(hide_password=False)
    try:
        done = image.run(
            "-m", "qshare_allocator", "migrate", extra={"QSHARE_ALLOCATOR_DATABASE_URL": url}
        )
        assert done.returncode == 0, done.stderr
        scratch = create_async_engine(url)
        async with scratch.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
        await scratch.dispose()
        assert version == head(url)
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        await admin.dispose()
