"""Inventory: nodes registering their cards and labels, and their heartbeats."""
