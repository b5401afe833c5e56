"""Benchmarks run by `qshare bench <name> --json PATH`: each measures, prints, writes JSON."""
