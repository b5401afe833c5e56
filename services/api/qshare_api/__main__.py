"""`python -m qshare_api`: serve the REST API with uvicorn (settings from `QSHARE_API_…`)."""

from __future__ import annotations

import logging
import sys

import uvicorn

from qshare_api.app import create_app
from qshare_api.settings import ApiSettings


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = ApiSettings()
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
