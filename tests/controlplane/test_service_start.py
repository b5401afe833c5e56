"""`python -m qshare_allocator|qshare_preemptor` that cannot start: one line naming the variable or
the server at fault, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qshare.natsauth import NatsAuth, ServiceRole, identity_env
from qshare.testing.servers import free_port
from qshare_allocator.__main__ import main as allocator
from qshare_preemptor.__main__ import main as preemptor


def test_migrate_without_postgres_names_the_url_without_its_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql+asyncpg://qshare:hush@127.0.0.1:{free_port()}/qshare"
    monkeypatch.setenv("QSHARE_ALLOCATOR_DATABASE_URL", url)
    assert allocator(["migrate"]) == 1
    err = capsys.readouterr().err
    assert "qshare allocator: cannot start: " in err and "hush" not in err
    assert "QSHARE_ALLOCATOR_DATABASE_URL is postgresql+asyncpg://qshare:***@127.0.0.1" in err


def test_a_database_url_that_is_not_postgres_gets_the_form_it_takes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QSHARE_ALLOCATOR_DATABASE_URL", "mysql://qshare@db/qshare")
    assert allocator(["migrate"]) == 2
    assert "the form is postgresql://USER:PASSWORD@HOST" in capsys.readouterr().err


def test_a_missing_nats_identity_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QSHARE_ALLOCATOR_NATS_SECRETS_DIR", str(tmp_path))
    assert allocator([]) == 1
    assert f"{tmp_path}/allocator.password is missing" in capsys.readouterr().err


def test_a_preemptor_database_url_that_is_not_postgres_gets_the_form_it_takes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QSHARE_PREEMPTOR_DATABASE_URL", "mysql://qshare:hush@db/qshare")
    assert preemptor([]) == 2
    err = capsys.readouterr().err
    assert "qshare preemptor: QSHARE_PREEMPTOR_DATABASE_URL=" in err and "hush" not in err
    assert "the form is postgresql://USER:PASSWORD@HOST" in err


def test_an_api_whose_start_fails_exits_non_zero(
    tmp_path: Path, bus_url: str, nats_auth: NatsAuth, database_url: str
) -> None:
    """A failure of the API's start (here: its bootstrap token file is missing) ends the
    process with a non-zero status, so that Kubernetes and scripts see it failed."""
    missing = tmp_path / "admin.token"
    env = dict(
        os.environ,
        QSHARE_API_NATS_URL=bus_url,
        QSHARE_API_DATABASE_URL=database_url,
        QSHARE_API_PORT=str(free_port()),
        QSHARE_API_BOOTSTRAP_ADMIN_TOKEN_FILE=str(missing),
        **identity_env("QSHARE_API_", nats_auth.credentials(ServiceRole.API)),
    )
    done = subprocess.run(
        [sys.executable, "-m", "qshare_api"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0, done.stderr[-2000:]
    assert str(missing) in done.stderr


def test_an_api_without_its_nats_identity_file_names_it_without_a_traceback(
    tmp_path: Path,
) -> None:
    """As the allocator and the preemptor do; before, uvicorn printed the start's traceback."""
    env = dict(
        os.environ,
        QSHARE_API_NATS_SECRETS_DIR=str(tmp_path),
        QSHARE_API_PORT=str(free_port()),
    )
    done = subprocess.run(
        [sys.executable, "-m", "qshare_api"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert f"qshare api: cannot start: no NATS identity api: {tmp_path}/api.password is missing" \
        in done.stderr  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
