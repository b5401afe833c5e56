"""`python -m qshare_allocator [serve|migrate]`: run one replica, or migrate the schema."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from qshare_allocator.app import Allocator
from qshare_allocator.migrate import upgrade
from qshare_allocator.settings import AllocatorSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qshare_allocator")
    parser.add_argument("action", nargs="?", choices=["serve", "migrate"], default="serve")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = AllocatorSettings()
    if args.action == "migrate":
        asyncio.run(upgrade(settings.database_url))
        return 0
    try:
        asyncio.run(Allocator(settings).run())
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
