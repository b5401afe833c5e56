"""`python -m qshare_allocator [serve|migrate]`: run one replica, or migrate the schema."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable

from qshare.contracts.tracing import otlp_settings
from qshare.envsettings import SettingsError, load, report
from qshare_allocator.app import Allocator
from qshare_allocator.migrate import upgrade
from qshare_allocator.settings import AllocatorSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qshare_allocator")
    parser.add_argument("action", nargs="?", choices=["serve", "migrate"], default="serve")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load(AllocatorSettings)
        otlp_settings()
    except SettingsError as exc:
        return report(exc, "qshare allocator")
    if args.action == "migrate":
        asyncio.run(upgrade(settings.database_url))
        return 0
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(Allocator(settings).run())
    except KeyboardInterrupt:
        return 0
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: the allocator spends much of its time in the event loop."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


if __name__ == "__main__":
    sys.exit(main())
