"""Error codes shared by the services, their HTTP statuses, and the error base class.

NATS replies carry errors the way nats.py's micro services do: headers
`Nats-Service-Error` (description) and `Nats-Service-Error-Code` (HTTP-like status),
and a JSON body `ErrorBody`. The api maps them to RFC 9457 problem documents.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

ERROR_HEADER = "Nats-Service-Error"
ERROR_CODE_HEADER = "Nats-Service-Error-Code"


class ErrorCode(StrEnum):
    INVALID = "invalid"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not-found"
    CONFLICT = "conflict"
    TOO_LARGE = "too-large"
    RATE_LIMITED = "rate-limited"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"

    @property
    def status(self) -> int:
        return _STATUS[self]

    @property
    def problem_title(self) -> str:
        return _TITLES[self]


_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID: 422,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.TOO_LARGE: 422,  # the issue asks 422 for every bad input, an oversized body too
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
}
_TITLES: dict[ErrorCode, str] = {
    ErrorCode.INVALID: "Invalid request",
    ErrorCode.UNAUTHORIZED: "Authentication required",
    ErrorCode.FORBIDDEN: "Not allowed",
    ErrorCode.NOT_FOUND: "Not found",
    ErrorCode.CONFLICT: "Conflict",
    ErrorCode.TOO_LARGE: "Request too large",
    ErrorCode.RATE_LIMITED: "Too many requests",
    ErrorCode.UNAVAILABLE: "Service unavailable",
    ErrorCode.INTERNAL: "Internal error",
}


class FieldError(BaseModel):
    """One invalid input: `field` is a dotted path such as `vcore` or `node_selector.zone`."""

    field: str
    message: str


class ErrorBody(BaseModel):
    """Body of a NATS error reply."""

    code: ErrorCode
    detail: str
    errors: list[FieldError] = []


class QshareError(Exception):
    """Base of every error a service raises on purpose; carries its code and field errors."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, detail: str, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors or []

    def body(self) -> ErrorBody:
        return ErrorBody(code=self.code, detail=self.detail, errors=self.errors)

    @classmethod
    def from_body(cls, body: ErrorBody) -> QshareError:
        """Rebuild the error on the receiving side of a NATS reply."""
        error = _BY_CODE.get(body.code, QshareError)(body.detail, body.errors)
        error.code = body.code
        return error


class InvalidInput(QshareError):
    code = ErrorCode.INVALID

    @classmethod
    def on(cls, field: str, message: str) -> InvalidInput:
        return cls(f"{field}: {message}", [FieldError(field=field, message=message)])


class Unauthorized(QshareError):
    code = ErrorCode.UNAUTHORIZED


class Forbidden(QshareError):
    code = ErrorCode.FORBIDDEN


class NotFound(QshareError):
    code = ErrorCode.NOT_FOUND


class Conflict(QshareError):
    code = ErrorCode.CONFLICT


class Unavailable(QshareError):
    code = ErrorCode.UNAVAILABLE


class RateLimited(QshareError):
    code = ErrorCode.RATE_LIMITED


_BY_CODE: dict[ErrorCode, type[QshareError]] = {
    ErrorCode.INVALID: InvalidInput,
    ErrorCode.UNAUTHORIZED: Unauthorized,
    ErrorCode.FORBIDDEN: Forbidden,
    ErrorCode.NOT_FOUND: NotFound,
    ErrorCode.CONFLICT: Conflict,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.RATE_LIMITED: RateLimited,
}
