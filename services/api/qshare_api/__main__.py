"""`python -m qshare_api`: serve the REST API with uvicorn (settings from `QSHARE_API_…`)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn
from pydantic import ValidationError

from qshare import startup
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
        settings = ApiSettings()
    except ValidationError as exc:
        startup.report("qshare api", startup.settings_errors(exc, "QSHARE_API_"))
        return 2
    app = create_app(settings, own_process=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info",
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
