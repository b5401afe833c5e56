"""Fixtures for the policy tests: a private directory for node segments."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture
def shm_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="qsp")  # short: the owner's socket path must fit 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)
