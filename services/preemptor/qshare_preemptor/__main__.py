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
        "(DATABASE_URL, NATS_URL, NATS_USER, NATS_PASSWORD).",
    ).parse_args(argv)
    from qshare_preemptor.app import Preemptor
    from qshare_preemptor.settings import PreemptorSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(Preemptor(PreemptorSettings()).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
