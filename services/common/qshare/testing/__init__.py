"""Helpers for tests, demos and benchmarks: real servers started from their wheels."""
