"""qshare: GPU sharing for clusters — the shared package (CLI, contracts, settings, benchmarks)."""

__version__ = "0.1.0"
