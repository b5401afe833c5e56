"""What `qshare check` looks at before a node agent starts on a machine, with the agent's own
settings: its cards, the segment directory, the interposer and the CUDA driver, the
timeslice, the PID namespace, NATS and the kubelet's directories. Each check says ok, warn
or fail and why; none changes the machine."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from qshare import bus
from qshare.launcher import find_library
from qshare.natsauth import ServiceRole
from qshare_driver import layout
from qshare_node_agent.discovery import Card, discover
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.settings import NodeAgentSettings

Status = Literal["ok", "warn", "fail"]
CUDA_DRIVER = "libcuda.so.1"
MIN_SHM_FREE = 64 << 20
"""Bytes free the segment directory should have: the segment and the vGPUs' sockets."""


@dataclass(frozen=True)
class Finding:
    """One check's verdict: `fail` stops an agent (or its workloads) from working, `warn`
    works with less than was asked."""

    check: str
    status: Status
    detail: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def check_cards(settings: NodeAgentSettings) -> Finding:
    try:
        cards = discover(settings)
    except Exception as error:  # NVML's own errors, a missing library, no GPU
        return Finding("cards", "fail", f"none found: {error}")
    return Finding("cards", "ok", _cards_line(cards))


def _cards_line(cards: list[Card]) -> str:
    models = Counter(f"{card.model} ({card.memory_mib} MiB)" for card in cards)
    return f"{len(cards)}: " + ", ".join(f"{n} x {model}" for model, n in models.items())


def check_segment_dir(settings: NodeAgentSettings) -> Finding:
    where = layout.segment_dir(settings.shm_dir)
    if not where.is_dir():
        return Finding("segment directory", "fail", f"{where} is not a directory")
    if not os.access(where, os.W_OK | os.X_OK):
        return Finding("segment directory", "fail", f"{where} is not writable by this user")
    free = shutil.disk_usage(where).free
    if free < MIN_SHM_FREE:
        short = f"{where} has {free >> 20} MiB free, under {MIN_SHM_FREE >> 20} MiB"
        return Finding("segment directory", "fail", short)
    return Finding("segment directory", "ok", _segment_line(settings, where, free))


def _segment_line(settings: NodeAgentSettings, where: Path, free: int) -> str:
    line = f"{where}, {free >> 20} MiB free"
    if layout.config_file(settings.segment_name, settings.shm_dir).exists():
        line += f"; segment {settings.segment_name} exists (a new agent adopts it)"
    return line


def check_interposer(env: dict[str, str]) -> Finding:
    found = find_library(None, env)
    if found is None:
        return Finding("interposer", "fail", "libqshare-cuda.so not found: set "
                       "QSHARE_CUDA_LIB, or build it (make native)")  # fmt: skip
    return Finding("interposer", "ok", str(found))


def check_cuda_driver(settings: NodeAgentSettings, load: Callable[[str], object]) -> Finding:
    if settings.simulate is not None:
        return Finding("CUDA driver", "ok", "not needed: simulated cards")
    try:
        library = load(CUDA_DRIVER)
    except OSError as error:
        return Finding("CUDA driver", "fail", f"{CUDA_DRIVER} does not load: {error}")
    return Finding("CUDA driver", "ok", f"{CUDA_DRIVER} loads{_version_of(library)}")


def _version_of(library: Any) -> str:
    """`, CUDA 12.8` from the driver's cuDriverGetVersion (no cuInit needed), or nothing."""
    version = ctypes.c_int(0)
    try:
        status = library.cuDriverGetVersion(ctypes.byref(version))
    except (AttributeError, OSError, TypeError):
        return ""
    if status != 0 or version.value <= 0:
        return ""
    return f", CUDA {version.value // 1000}.{version.value % 1000 // 10}"


def check_timeslice(settings: NodeAgentSettings, euid: int) -> Finding:
    level = settings.timeslice
    if level == "driver":
        return Finding("timeslice", "ok", "left as the driver has it (QSHARE_NODE_TIMESLICE)")
    if settings.simulate is not None:
        return Finding("timeslice", "warn", f"{level!r} is not applied to simulated cards")
    if shutil.which(settings.nvidia_smi) is None:
        return Finding("timeslice", "fail", f"{level!r} asked, but {settings.nvidia_smi} "
                       "is not found (QSHARE_NODE_NVIDIA_SMI)")  # fmt: skip
    if euid != 0:
        why = "nvidia-smi compute-policy needs root, and this user is not"
        return Finding("timeslice", "warn", f"{level!r} asked: {why}; the cards keep the driver's")
    return Finding("timeslice", "ok", f"{level!r} will be set with {settings.nvidia_smi}")


def check_pid_namespace(proc: Path) -> Finding:
    """The agent must see the workloads' processes: a restarted agent adopts each one it finds
    alive (by pid, docs/driver.md). Kernel threads (kthreadd is pid 2) are seen only from the
    host's PID namespace."""
    try:
        seen = (proc / "2" / "comm").read_text().strip() == "kthreadd"
    except OSError:
        seen = False
    if seen:
        return Finding("PID namespace", "ok", "the host's: a restarted agent adopts running "
                       "workloads")  # fmt: skip
    return Finding("PID namespace", "warn", "one of its own (no kernel threads seen): a "
                   "restarted agent cannot see the workloads' processes, so it gives back "
                   "their memory while they still hold it; run it in the host's (hostPID: "
                   "true, as deploy/kubernetes does)")  # fmt: skip


async def check_nats(settings: NodeAgentSettings, timeout_s: float) -> Finding:
    options = settings.bus_as(f"qshare-check/{settings.name}", ServiceRole.NODE, settings.name)
    with _bus_errors() as errors:
        try:
            nc = await asyncio.wait_for(bus.connect(options), timeout_s)
        except TimeoutError:
            last = f" (last: {errors[-1]})" if errors else ""
            return Finding("NATS", "fail", f"no server answered at {settings.nats_url} "
                           f"within {timeout_s:g} s{last}")  # fmt: skip
        except PermissionError as error:
            return Finding("NATS", "fail", str(error))
    await bus.close(nc)
    return Finding("NATS", "ok", f"connected to {settings.nats_url} as {options.user or 'anyone'}")


@contextmanager
def _bus_errors() -> Iterator[list[str]]:
    """The connection errors `qshare.bus` logs meanwhile, kept for the finding, not printed."""
    errors: list[str] = []
    handler = _Keep(errors)
    logger = logging.getLogger(bus.__name__)
    logger.addHandler(handler)
    was, logger.propagate = logger.propagate, False
    try:
        yield errors
    finally:
        logger.removeHandler(handler)
        logger.propagate = was


class _Keep(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage().split("NATS error: ", 1)[-1])


def check_kubelet(k8s: KubernetesSettings) -> list[Finding]:
    """The kubelet's plugin directories and the CDI directory, each writable. The agent would
    create a missing one, but inside its own container, where neither the kubelet nor the
    container runtime looks: missing means not mounted."""
    kubelet, runtime = "the kubelet's", "the container runtime's"
    dirs = [("plugin registry", k8s.registry_dir, kubelet),
            ("device plugins", k8s.device_plugin_dir, kubelet),
            ("DRA plugin", k8s.plugin_dir.parent, kubelet),
            ("CDI specs", k8s.cdi_dir, runtime)]  # fmt: skip
    return [_writable_dir(f"kubelet: {what}", where, whose) for what, where, whose in dirs]


def _writable_dir(check: str, where: Path, whose: str) -> Finding:
    if not where.is_dir():
        return Finding(check, "fail", f"{where} is not a directory here ({whose}: is it "
                       "mounted into the agent?)")  # fmt: skip
    if not os.access(where, os.W_OK | os.X_OK):
        return Finding(check, "fail", f"{where} is not writable by this user")
    return Finding(check, "ok", str(where))


def failed(findings: list[Finding]) -> bool:
    return any(f.status == "fail" for f in findings)


@dataclass(frozen=True)
class Machine:
    """What the checks read of the machine beyond the settings (tests give their own)."""

    env: dict[str, str]
    euid: int
    load: Callable[[str], object]
    proc: Path = Path("/proc")

    @classmethod
    def this_one(cls) -> Machine:
        return cls(dict(os.environ), os.geteuid(), ctypes.CDLL)


async def run_checks(
    settings: NodeAgentSettings, k8s: KubernetesSettings | None, machine: Machine,
    nats_timeout_s: float | None,
) -> list[Finding]:  # fmt: skip
    """Every check in turn; NATS is skipped when `nats_timeout_s` is None."""
    findings = [
        check_cards(settings),
        check_segment_dir(settings),
        check_interposer(machine.env),
        check_cuda_driver(settings, machine.load),
        check_timeslice(settings, machine.euid),
        check_pid_namespace(machine.proc),
    ]
    if nats_timeout_s is not None:
        findings.append(await check_nats(settings, nats_timeout_s))
    if k8s is not None:
        findings += check_kubelet(k8s)
    return findings
