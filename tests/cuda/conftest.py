"""Fixtures for the CUDA interposer tests: build the interposer, the fake driver and the
probe programs with make, own a node segment (the C test node), and run probes under
LD_PRELOAD against the fake libcuda.so.1 / libnvidia-ml.so.1 test doubles."""

from __future__ import annotations

import itertools
import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from qshare.native_build import BUILD, FAKE_DIR, INTERPOSER, TOOLS, build_cuda

CARD_UUID = "GPU-0a1b2c3d-0000-4000-8000-00000000c0de"
OTHER_UUID = "GPU-ffffffff-0000-4000-8000-000000000bad"
GIB = 1 << 30
CARD_MEM = 16 * GIB
HP_VGPU, LP_VGPU, SMALL_VGPU = 1, 2, 3
HP_LIMIT, LP_LIMIT, SMALL_LIMIT = 4 * GIB, 2 * GIB, 1 * GIB
_names = itertools.count()


@pytest.fixture(scope="session")
def cuda_build() -> Path:
    build_cuda()
    return BUILD


def parse_reply(line: str) -> dict[str, str]:
    """'alloc rc=0 id=1' -> {'cmd': 'alloc', 'rc': '0', 'id': '1'}."""
    head, *pairs = line.split()
    reply = {"cmd": head}
    reply.update(pair.split("=", 1) for pair in pairs if "=" in pair)
    return reply


@dataclass
class NodeOwner:
    """The owner of a segment: events and statistics as the C test node prints them."""

    name: str
    directory: Path
    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen_events: list[dict[str, str]] = field(default_factory=list)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put("exited")

    def _next(self, cmd: str, timeout: float = 10.0) -> dict[str, str]:
        while True:
            reply = parse_reply(self.lines.get(timeout=timeout))
            if reply["cmd"] == "event":
                self.seen_events.append(reply)
            elif reply["cmd"] == cmd:
                return reply

    def command(self, line: str) -> dict[str, str]:
        """Send `stats|suspend|resume ID` and return the node's reply."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self._next(line.split()[0])

    def stats(self, vgpu: int) -> dict[str, int]:
        return {k: int(v) for k, v in self.command(f"stats {vgpu}").items() if k != "cmd"}

    def device_ns_once(self, vgpu: int, at_least: int, timeout: float = 10.0) -> int:
        """The vGPU's device time once it has reached `at_least` (or at `timeout`): a process's
        last units are ended, and their time charged, by its completion thread a little after
        the work completes, so a test reads it while the process still lives."""
        deadline = time.monotonic() + timeout
        device_ns = self.stats(vgpu)["device_ns"]
        while device_ns < at_least and time.monotonic() < deadline:
            time.sleep(0.02)
            device_ns = self.stats(vgpu)["device_ns"]
        return device_ns

    def events(self, kind: int) -> list[dict[str, str]]:
        """Events of `kind` (qs_event_kind) printed so far."""
        self.stats(HP_VGPU)  # a round trip: events printed before it have been read
        return self._seen(kind)

    def _seen(self, kind: int) -> list[dict[str, str]]:
        return [e for e in self.seen_events if int(e["kind"]) == kind]

    def wait_events(self, kind: int, count: int, timeout: float = 5.0) -> list[dict[str, str]]:
        """Events of `kind` once `count` have been printed (or at `timeout`): the node's event
        thread prints them on its own schedule, after whatever pushed them has returned."""
        deadline = time.monotonic() + timeout
        found = self.events(kind)
        while len(found) < count and (left := deadline - time.monotonic()) > 0:
            try:
                reply = parse_reply(self.lines.get(timeout=left))
            except queue.Empty:
                break
            if reply["cmd"] == "event":
                self.seen_events.append(reply)
                found = self._seen(kind)
        return found

    def env(self, vgpu: int | None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            QSHARE_SEGMENT=self.name,
            QSHARE_SHM_DIR=str(self.directory),
            QSHARE_FAKE_GPU_UUID=CARD_UUID,
            QSHARE_FAKE_GPU_MEM=str(CARD_MEM),
            LD_LIBRARY_PATH=str(FAKE_DIR),
        )
        env.pop("QSHARE_VGPU", None)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # the fake driver honours it, as the real one
        for name in [n for n in env if n.startswith(("QSHARE_VGPU_", "QSHARE_VISIBLE_"))]:
            del env[name]
        if vgpu is not None:
            env["QSHARE_VGPU"] = str(vgpu)
        return env


def start_node(
    directory: Path,
    release_delay_ms: int = 20,
    cards: Sequence[str] = (CARD_UUID,),
    vgpus: Sequence[str] | None = None,
) -> NodeOwner:
    """A test node with `cards` (UUIDs, CARD_MEM each, indexed in order) and `vgpus`
    ("ID:CARD:high|low:SHARE:LIMIT"; by default HP, LP and SMALL on card 0)."""
    name = f"cuda-test-{os.getpid()}-{next(_names)}"
    vgpus = vgpus or [
        f"{HP_VGPU}:0:high:100:{HP_LIMIT}",
        f"{LP_VGPU}:0:low:50:{LP_LIMIT}",
        f"{SMALL_VGPU}:0:low:50:{SMALL_LIMIT}",
    ]
    argv = [str(TOOLS / "qshare-testnode"), "--name", name, "--dir", str(directory)]
    argv += ["--release-delay-ms", str(release_delay_ms)]
    for card in cards:
        argv += ["--card", f"{card}:{CARD_MEM}"]
    for spec in vgpus:
        argv += ["--vgpu", spec]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    node = NodeOwner(name, directory, proc)
    threading.Thread(target=node._read, daemon=True).start()
    assert node.lines.get(timeout=10) == "ready"
    return node


def running_node(
    tmp_path: Path, cards: Sequence[str] = (CARD_UUID,), vgpus: Sequence[str] | None = None
) -> Iterator[NodeOwner]:
    """A test node started as `start_node` starts it, told to quit when the test ends
    (yield from it in a fixture)."""
    n = start_node(tmp_path, cards=cards, vgpus=vgpus)
    yield n
    assert n.process.stdin is not None
    n.process.stdin.write("quit\n")
    n.process.stdin.flush()
    n.process.wait(timeout=10)


@pytest.fixture
def node(cuda_build: Path, tmp_path: Path) -> Iterator[NodeOwner]:
    yield from running_node(tmp_path)


@dataclass
class ProbeRun:
    replies: list[dict[str, str]]
    stderr: str
    returncode: int

    def reply(self, cmd: str, index: int = 0) -> dict[str, str]:
        return [r for r in self.replies if r["cmd"] == cmd][index]

    def rc(self, cmd: str, index: int = 0) -> int:
        return int(self.reply(cmd, index)["rc"])

    def device_used(self, index: int = 0) -> int:
        """Bytes the fake card held at the run's `devused` command (`index`-th)."""
        return int(self.reply("devused", index)["bytes"])


def probe_argv(style: str) -> list[str]:
    if style == "direct":
        return [str(TOOLS / "probe-direct")]
    if style == "runtime":
        return [str(TOOLS / "probe-runtime")]
    return [str(TOOLS / "probe-runtime"), "--per-thread"]


def run_probe(
    node: NodeOwner,
    vgpu: int | None,
    commands: Sequence[str],
    style: str = "direct",
    extra_env: dict[str, str] | None = None,
) -> ProbeRun:
    """Run the probe once under the interposer, commands given as arguments."""
    env = node.env(vgpu)
    env["LD_PRELOAD"] = str(INTERPOSER)
    env.update(extra_env or {})
    done = subprocess.run(
        [*probe_argv(style), *commands], env=env, capture_output=True, text=True, timeout=60
    )
    replies = [parse_reply(line) for line in done.stdout.splitlines() if line.strip()]
    return ProbeRun(replies, done.stderr, done.returncode)


class Probe:
    """A probe kept running, driven one command at a time (for orderings across processes)."""

    def __init__(
        self,
        node: NodeOwner,
        vgpu: int,
        style: str = "direct",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        env = node.env(vgpu)
        env["LD_PRELOAD"] = str(INTERPOSER)
        env.update(extra_env or {})
        self.process = subprocess.Popen(
            probe_argv(style), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, str]:
        assert self.process.stdout is not None
        return parse_reply(self.process.stdout.readline())

    def ask(self, command: str) -> dict[str, str]:
        self.send(command)
        return self.receive()

    def close(self) -> None:
        self.send("quit")
        self.process.wait(timeout=30)


@pytest.fixture
def hp_probe(node: NodeOwner) -> Iterator[Probe]:
    """A high-priority process attached to the card, launching only what a test asks of it."""
    probe = Probe(node, HP_VGPU)
    assert probe.ask("init")["rc"] == "0"
    yield probe
    probe.close()
