"""`python -m qshare_api`: serve the REST API with uvicorn (settings from `QSHARE_API_…`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qshare import startup
from qshare.contracts.tracing import otlp_settings
from qshare.envsettings import SettingsError, load, report
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings

GRACEFUL_SHUTDOWN_S = 5
"""Open event streams (`/v1/events`) never end by themselves: stop waiting for them then."""


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m qshare_api",
        description="The qshare REST API. Settings come from QSHARE_API_* variables "
        "(DATABASE_URL, NATS_URL, NATS_SECRETS_DIR, HOST, PORT, BOOTSTRAP_ADMIN_TOKEN_FILE, ...).",
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load(ApiSettings)
        otlp_settings()
    except SettingsError as exc:
        return report(exc, "qshare api")
    app = create_app(settings, own_process=True)
    # the client is the peer unless QSHARE_API_TRUSTED_PROXIES names it a proxy (addresses.py);
    # uvicorn's own would believe X-Forwarded-For from 127.0.0.1, where port-forwards come from
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                            proxy_headers=False)  # fmt: skip
    server = StoppableWhileStarting(config)
    config.app = _quiet_when_stopped(app, server, settings.database_url)
    server.run()
    return 0


def _quiet_when_stopped(app: ASGIApp, server: StoppableWhileStarting, database_url: str) -> ASGIApp:
    """`app`, except that its lifespan does not report a start that a stop signal ended as a
    failure (uvicorn would log it as one, with the cancellation's traceback), and reports a
    start its settings explain failing in one line each (`_explained`)."""

    async def call(scope: Scope, receive: Receive, send: Send) -> None:
        async def reported(message: Message) -> None:
            if not (server.stopped_while_starting and message["type"].endswith(".failed")):
                await send(_explained(message, database_url))

        try:
            await app(scope, receive, reported if scope["type"] == "lifespan" else send)
        except asyncio.CancelledError:
            if not server.stopped_while_starting:
                raise

    return call


def _explained(message: Message, database_url: str) -> Message:
    """A failed start's report, whose text is the traceback, as the allocator's and the
    preemptor's: `qshare api: cannot start: …` naming the file, server or variable at fault,
    when its cause is one of startup.CANNOT_START. Starlette reports the failure from inside
    its `except` block, so the exception is the one being handled."""
    failure = sys.exc_info()[1]
    if message["type"] != "lifespan.startup.failed" or not isinstance(
        failure, startup.CANNOT_START
    ):
        return message
    lines = startup.cannot_start(failure, "QSHARE_API_", database_url)
    return {**message, "message": "\n".join(f"qshare api: {line}" for line in lines)}


class StoppableWhileStarting(uvicorn.Server):
    """uvicorn's server, except that SIGTERM or SIGINT while the application is still starting
    (its lifespan waits for a NATS server that is not up yet) ends the start. uvicorn itself
    looks at signals only once the start is over, so it could not be stopped before."""

    serving: asyncio.Task[None] | None = None
    stopped_while_starting = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if not self.started and self.serving is not None:
            self.stopped_while_starting = True
            self.serving.get_loop().call_soon_threadsafe(self.serving.cancel)

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.serving = asyncio.current_task()
        try:
            await super().serve(sockets)
        except asyncio.CancelledError:
            if not self.stopped_while_starting:
                raise
            logging.getLogger(__name__).info("asked to stop while starting")


if __name__ == "__main__":
    sys.exit(main())
