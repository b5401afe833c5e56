"""`python -m qshare_allocator [serve|migrate]`: run one replica, or migrate the schema."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable

from qshare import startup
from qshare.contracts.tracing import otlp_settings
from qshare.envsettings import SettingsError, load, report, say
from qshare_allocator.app import Allocator
from qshare_allocator.migrate import upgrade
from qshare_allocator.settings import AllocatorSettings

PROGRAM = "qshare allocator"
ENV_PREFIX = "QSHARE_ALLOCATOR_"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qshare_allocator",
        description="A qshare allocator replica (serve, the default), or the schema's "
        "migration (migrate). Settings come from QSHARE_ALLOCATOR_* variables (DATABASE_URL, "
        "NATS_URL, NATS_SECRETS_DIR, METRICS_PORT, ...).",
    )
    parser.add_argument("action", nargs="?", choices=["serve", "migrate"], default="serve")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load(AllocatorSettings)
        otlp_settings()
    except SettingsError as exc:
        return report(exc, PROGRAM)
    try:
        _run(args.action, settings)
    except KeyboardInterrupt:
        return 0
    except startup.CANNOT_START as exc:
        say(PROGRAM, startup.cannot_start(exc, ENV_PREFIX, settings.database_url))
        return 1
    return 0


def _run(action: str, settings: AllocatorSettings) -> None:
    if action == "migrate":
        asyncio.run(upgrade(settings.database_url))
        return
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(Allocator(settings).run())


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
