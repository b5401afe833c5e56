"""The one container image (the root Dockerfile) holds what the Kubernetes manifests and
the compose stack run. No Docker
engine runs here, so its build is replayed: the Dockerfile's COPY lines into a scratch
tree, its `make image-install` into a scratch root, then each manifest's command runs
from that root with an interpreter that sees only the image's packages and their
dependencies (not the repository's sources, as the development venv does)."""

from __future__ import annotations

import os
import re
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
from write_paths_pth import package_roots

from qshare_allocator.migrate import head

from .test_manifests import all_objects

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERIGNORE = ROOT / ".dockerignore"
PACKAGE_ROOTS = package_roots(ROOT)
"""pyproject.toml's `packages.find` roots: each package under one lands in site-packages."""


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
    site: Path

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


def dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore's patterns, each (excludes, regex over a path relative to the context):
    `**` any number of directories, `*` and `?` within one name, `!` re-includes."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        include = pattern.startswith("!")
        parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern.lstrip("!").strip("/"))
        wild = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
        rules.append((not include, re.compile("".join(wild.get(p, re.escape(p)) for p in parts))))
    return rules


def ignored(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves `relative` out of the build context: the last rule matching it
    or one of its directories decides."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for excludes, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            verdict = excludes
    return verdict


def context_filter(dirpath: str, names: list[str]) -> list[str]:
    """shutil.copytree's `ignore`: what .dockerignore keeps out of the build context."""
    rules = dockerignore()
    here = Path(dirpath).relative_to(ROOT)
    return [name for name in names if ignored((here / name).as_posix(), rules)]


def copy_into(stage: Stage, top: Path) -> None:
    """The stage's COPY lines from the repository's build context (less what .dockerignore
    leaves out, local build outputs among them) into `top`, the image's `/`."""
    for sources, dest in stage.copies:
        target = top / stage.workdir.lstrip("/") / dest
        for source in sources:
            path = ROOT / source
            if path.is_dir():
                shutil.copytree(path, target, ignore=context_filter)
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
    return Image(base / "root", interpreter(base, image_site), env, image_site)


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
    before = files_of(image.root)
    done = image.run("-m", module, "--help")
    assert done.returncode == 0, done.stderr
    assert f"python -m {module}" in done.stdout
    assert files_of(image.root) == before  # the manifests' root filesystem is read-only


def files_of(root: Path) -> dict[str, int]:
    """Every file under `root`, with its modification time."""
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


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
    before = files_of(image.root)
    try:
        done = image.run(
            "-m", "qshare_allocator", "migrate", extra={"QSHARE_ALLOCATOR_DATABASE_URL": url}
        )
        assert done.returncode == 0, done.stderr
        assert files_of(image.root) == before  # no bytecode of the migrations either
        scratch = create_async_engine(url)
        async with scratch.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
        await scratch.dispose()
        assert version == head(url)
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        await admin.dispose()


def tracked(*paths: str) -> list[str]:
    done = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return done.stdout.splitlines()


def packaged_files() -> list[tuple[str, str]]:
    """(repository path, site-packages path) of every file git tracks in a package: modules,
    .proto and .schema.json files, bench traces, py.typed (the loose scripts beside the
    packages, such as native/python/write_paths_pth.py, are no package's)."""
    found = []
    for root in PACKAGE_ROOTS:
        for path in tracked(root):
            inside = Path(path).relative_to(root)
            if len(inside.parts) > 1:
                found.append((path, inside.as_posix()))
    return found


def test_every_file_git_tracks_in_a_package_is_in_the_image(image: Image) -> None:
    missing = [repo for repo, site in packaged_files() if not (image.site / site).is_file()]
    assert missing == []


def test_every_migration_git_tracks_is_in_the_image(image: Image) -> None:
    missing = [
        p for p in tracked("migrations", "alembic.ini") if not (image.root / "app" / p).is_file()
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("path", "left_out"),
    [
        ("native/build/libqshare.so", True),
        ("services/common/qshare/__pycache__/dburl.cpython-311.pyc", True),
        ("qshare.egg-info/PKG-INFO", True),
        ("native/python/qshare_driver/_ffi.cpython-311-x86_64-linux-gnu.so", True),
        ("services/node-agent/qshare_node_agent/kubernetes/protos/dra_v1.proto", False),
        ("native/cuda/launch.c", False),
        ("native/src/build_notes.c", False),  # a name with "build" in it is no build output
        # the secrets `python -m qshare.natsauth init ./secrets` writes (docs/control-plane.md)
        ("secrets/admin.token", True),
        ("secrets/nats.conf", True),
        ("compose/secrets/allocator.password", True),
    ],
)  # fmt: skip
def test_the_replay_reads_dockerignore_as_docker_does(path: str, left_out: bool) -> None:
    assert ignored(path, dockerignore()) is left_out
