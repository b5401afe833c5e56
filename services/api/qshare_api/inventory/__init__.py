"""Nodes and GPUs over REST: reads from Postgres; registration goes to the allocator."""
