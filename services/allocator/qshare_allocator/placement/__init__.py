"""Placement: which node and cards a claim's vGPUs go to, and the capacity they hold."""
