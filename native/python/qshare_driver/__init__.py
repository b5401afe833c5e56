"""Python binding of the qshare node driver: the owner's `Node` and the workload's `Client`."""

from qshare_driver.client import Client, ClientInfo
from qshare_driver.errors import (
    AgentUnreachableError,
    AlreadyExistsError,
    DestroyedError,
    DriverError,
    InvalidArgumentError,
    NotFoundError,
    OutOfMemoryError,
    SegmentMismatchError,
    ShareSumError,
)
from qshare_driver.lp_window import lp_window_admits, lp_window_in_force_ns
from qshare_driver.node import CardStats, Event, EventKind, Node, Policy, Priority, VgpuStats

__all__ = [
    "AgentUnreachableError",
    "AlreadyExistsError",
    "CardStats",
    "Client",
    "ClientInfo",
    "DestroyedError",
    "DriverError",
    "Event",
    "EventKind",
    "InvalidArgumentError",
    "Node",
    "NotFoundError",
    "OutOfMemoryError",
    "Policy",
    "Priority",
    "SegmentMismatchError",
    "ShareSumError",
    "VgpuStats",
    "lp_window_admits",
    "lp_window_in_force_ns",
]
