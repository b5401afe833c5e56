"""RFC 9457 problem documents: the one place where errors become HTTP responses."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from qshare.contracts.errors import ErrorCode, FieldError, QshareError

log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://qshare.io/problems/"


class Problem(BaseModel):
    """An RFC 9457 problem; `errors` names each invalid field."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldError] = []


def problem_response(
    request: Request, code: ErrorCode, detail: str, errors: list[FieldError] | None = None
) -> JSONResponse:
    body = Problem(
        type=TYPE_BASE + code.value,
        title=code.problem_title,
        status=code.status,
        detail=detail,
        instance=request.url.path,
        errors=errors or [],
    )
    headers = {"WWW-Authenticate": "Bearer"} if code is ErrorCode.UNAUTHORIZED else None
    return JSONResponse(
        body.model_dump(exclude_none=True), code.status, headers=headers, media_type=PROBLEM_JSON
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(QshareError, _qshare_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)


async def _qshare_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, QshareError)
    return problem_response(request, exc.code, exc.detail, exc.errors)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [_field_error(e) for e in exc.errors()]
    detail = "; ".join(f"{e.field}: {e.message}" for e in errors)
    return problem_response(request, ErrorCode.INVALID, detail, errors)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = next((c for c in ErrorCode if c.status == exc.status_code), None)
    if code is None:
        return JSONResponse({"detail": exc.detail}, exc.status_code, media_type=PROBLEM_JSON)
    return problem_response(request, code, str(exc.detail))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s", request.url.path, exc_info=exc)
    return problem_response(request, ErrorCode.INTERNAL, "internal error; see the api logs")


def _field_error(error: Any) -> FieldError:
    """`("body", "vcore")` → `vcore`; a body that is not JSON → `body`."""
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "header")]
    if error.get("type") == "json_invalid":
        loc = []
    return FieldError(field=".".join(loc) or "body", message=str(error.get("msg", "invalid")))


PROBLEMS: dict[int | str, dict[str, Any]] = {
    code.status: {"model": Problem, "description": code.problem_title}
    for code in (
        ErrorCode.UNAUTHORIZED,
        ErrorCode.FORBIDDEN,
        ErrorCode.NOT_FOUND,
        ErrorCode.INVALID,
    )
}
"""The problem documents every authenticated route may answer, for OpenAPI."""
