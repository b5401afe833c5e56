"""`python -m qshare.bench NAME ...`: the benchmarks without the rest of the CLI, for a GPU
machine that has PyTorch but not qshare's service dependencies (`qshare bench gpu` imports
only the standard library and the native build)."""

from __future__ import annotations

import argparse
import sys

from qshare.bench.cli import register


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m qshare.bench")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *sys.argv[1:]])
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
