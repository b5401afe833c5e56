"""Contracts shared by every qshare service: domain types, quantities, the message envelope,
NATS subjects, error codes, message schemas and the control-plane Postgres schema.

Change a contract deliberately: update every side of it in the same change.
"""
