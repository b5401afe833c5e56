"""Carrying placements to nodes: each node's desired vGPU set, its confirmation, and the
claim transitions (ready, failed) that a node's answer decides."""
