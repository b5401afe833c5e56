"""`python -m qshare_preemptor`: run the preemptor (settings from QSHARE_PREEMPTOR_*)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m qshare_preemptor",
        description="The qshare preemptor: gang suspension across cards and nodes, operator "
        "suspend/resume, preemption records. Settings come from QSHARE_PREEMPTOR_* variables "
        "(DATABASE_URL, NATS_URL, NATS_SECRETS_DIR or NATS_USER and NATS_PASSWORD, "
        "...).",
    ).parse_args(argv)
    from qshare import startup
    from qshare.contracts.tracing import otlp_settings
    from qshare.envsettings import SettingsError, load, report, say
    from qshare_preemptor.app import Preemptor
    from qshare_preemptor.settings import PreemptorSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = load(PreemptorSettings)
        otlp_settings()
    except SettingsError as exc:
        return report(exc, "qshare preemptor")
    try:
        asyncio.run(Preemptor(settings).run())
    except KeyboardInterrupt:
        return 0
    except startup.CANNOT_START as exc:
        lines = startup.cannot_start(exc, "QSHARE_PREEMPTOR_", settings.database_url)
        say("qshare preemptor", lines)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
