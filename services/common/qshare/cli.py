"""The `qshare` command line: one entry point whose sub-commands live in their own modules."""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Protocol

# Each module named here exposes `register(subparsers)`; imported only when the CLI runs.
COMMAND_MODULES: tuple[str, ...] = (
    "qshare.bench.cli",
    "qshare.demo",
    "qshare.launcher",
    "qshare.up",
    "qshare_api.cli",
    "qshare_api.cli_admin",
    "qshare_api.cli_events",
    "qshare_api.cli_history",
    "qshare_node_agent.cli_check",
)


class _Registrar(Protocol):
    def __call__(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


def _registrars() -> list[_Registrar]:
    found: list[_Registrar] = []
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        found.append(module.register)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qshare", description="GPU sharing for clusters.")
    parser.add_argument("--version", action="version", version=f"qshare {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in _registrars():
        register(subparsers)
    return parser


def _version() -> str:
    """The installed package's version (a checkout run from its sources has none)."""
    try:
        return metadata.version("qshare")
    except metadata.PackageNotFoundError:
        return "(not installed: run from a checkout)"


CONNECTION_OPTIONS = ("--url", "--token", "-o", "--output")
"""The API groups' options, which go after the group's name (`qshare claims --url U list`)."""


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0].split("=")[0] in CONNECTION_OPTIONS:
        print(f"qshare: {given[0].split('=')[0]} goes after the command's group, as in "
              "`qshare claims --url URL list` or `qshare claims list --url URL`",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        args = build_parser().parse_args(given)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE


EXIT_BROKEN_PIPE = 141
"""What a shell reports for a program killed by SIGPIPE: `qshare claims list | head` ends
quietly, as other command-line tools do, instead of with a traceback."""


def _stdout_to_devnull() -> None:
    """The reader is gone: point stdout at /dev/null so the interpreter's final flush of
    what is still buffered does not fail again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass


if __name__ == "__main__":
    sys.exit(main())
