"""Typed exceptions for every status code of the driver; the message names the problem."""

from __future__ import annotations


class DriverError(Exception):
    """A driver call failed; `status` is the C status code."""

    status: int = -1

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(DriverError, ValueError):
    """An argument is out of range or malformed."""


class NotFoundError(DriverError, LookupError):
    """No such segment, card or vGPU."""


class AlreadyExistsError(DriverError):
    """The segment, card or vGPU already exists."""


class SegmentMismatchError(DriverError):
    """The segment is not a qshare segment of this ABI version and size."""


class OutOfMemoryError(DriverError, MemoryError):
    """A reservation would exceed the vGPU's memory limit."""


class ShareSumError(InvalidArgumentError):
    """Core shares on a card would sum over 100."""


class DestroyedError(DriverError):
    """The vGPU was destroyed."""


class AgentUnreachableError(DriverError, ConnectionError):
    """The node owner does not answer."""


class TableFullError(DriverError):
    """A fixed-size table in the segment is full."""


class DriverTimeoutError(DriverError, TimeoutError):
    """Nothing happened before the timeout."""


_BY_STATUS: dict[int, type[DriverError]] = {
    -1: InvalidArgumentError,
    -2: InvalidArgumentError,
    -3: AlreadyExistsError,
    -4: NotFoundError,
    -5: SegmentMismatchError,
    -6: SegmentMismatchError,
    -7: SegmentMismatchError,
    -8: InvalidArgumentError,
    -9: InvalidArgumentError,
    -10: OutOfMemoryError,
    -11: InvalidArgumentError,
    -12: TableFullError,
    -13: DestroyedError,
    -15: DriverTimeoutError,
    -16: InvalidArgumentError,
    -17: DriverError,
    -18: AgentUnreachableError,
    -20: InvalidArgumentError,
    -21: ShareSumError,
}


def error_for(status: int, message: str) -> DriverError:
    return _BY_STATUS.get(status, DriverError)(message, status)
