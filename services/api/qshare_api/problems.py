"""RFC 9457 problem documents: the one place where errors become HTTP responses."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match

from qshare.contracts.errors import ErrorCode, FieldError, QshareError
from qshare.outages import OUTAGE_BASES, RETRY_AFTER_S, is_outage

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
    headers = _HEADERS.get(code)
    return JSONResponse(
        body.model_dump(exclude_none=True), code.status, headers=headers, media_type=PROBLEM_JSON
    )


_HEADERS: dict[ErrorCode, dict[str, str]] = {
    ErrorCode.UNAUTHORIZED: {"WWW-Authenticate": "Bearer"},
    ErrorCode.UNAVAILABLE: {"Retry-After": str(RETRY_AFTER_S)},
    ErrorCode.RATE_LIMITED: {"Retry-After": "1"},
}


def install(app: FastAPI) -> None:
    app.add_exception_handler(QshareError, _qshare_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    for kind in OUTAGE_BASES:  # handled here, not re-raised by the server-error middleware
        app.add_exception_handler(kind, _unexpected)
    app.add_exception_handler(Exception, _unexpected)


async def _qshare_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, QshareError)
    response = problem_response(request, exc.code, exc.detail, exc.errors)
    retry_after_s = getattr(exc, "retry_after_s", None)  # a rate limit's own wait
    if retry_after_s is not None:
        response.headers["Retry-After"] = str(retry_after_s)
    return response


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = _not_json(request, exc.errors()) or [_field_error(e) for e in exc.errors()]
    detail = "; ".join(f"{e.field}: {e.message}" for e in errors)
    return problem_response(request, ErrorCode.INVALID, detail, errors)


def _not_json(request: Request, errors: Sequence[Any]) -> list[FieldError]:
    """A body that was not read as JSON because it was not sent as JSON (`curl -d` sends a
    form): said so, where FastAPI says only that the body is no object."""
    kind = request.headers.get("content-type")
    whole_body = any(tuple(e.get("loc", ())) == ("body",) for e in errors)
    if not whole_body or (kind is not None and "json" in kind.lower()):
        return []
    sent = f"it was sent as {kind}" if kind else "it was sent with no Content-Type"
    message = f"the body must be JSON, with Content-Type: application/json ({sent})"
    return [FieldError(field="body", message=message)]


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's and FastAPI's own errors as problem documents, keeping their headers
    (`Allow` on a 405). A body FastAPI could not even decode (not UTF-8) is a 422 on `body`."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400:
        detail = f"the body could not be read as UTF-8 JSON ({exc.detail})"
        return problem_response(
            request, ErrorCode.INVALID, detail, [FieldError(field="body", message=detail)]
        )
    code = next((c for c in ErrorCode if c.status == exc.status_code), None)
    detail = str(exc.detail)
    if exc.status_code == 404:  # the router's: a missing resource is qshare's own NotFound
        detail = (
            f"no route {request.method} {request.url.path}: the routes are /v1/... under the "
            "API's root URL (e.g. http://127.0.0.1:8080), as /docs lists them"
        )
    response = (
        problem_response(request, code, detail)
        if code is not None
        else _plain_problem(request, exc.status_code, detail)
    )
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:
        response.headers["Allow"] = ", ".join(_allowed_methods(request))
    return response


ROUTED_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> list[str]:
    """Every method the router serves at this path (FastAPI gives each method a route of its
    own, so the router's 405 names only one), asked of the router itself, so a
    `{tenant:path}` holding a `/` counts (the OpenAPI templates, matched one segment a name
    before, gave it an empty `Allow`)."""
    routes = request.app.router.routes
    return [
        method
        for method in ROUTED_METHODS
        if any(r.matches(dict(request.scope, method=method))[0] == Match.FULL for r in routes)
    ]


def _plain_problem(request: Request, status: int, detail: str) -> JSONResponse:
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    body = Problem(
        type=f"{TYPE_BASE}http-{status}",
        title=phrase,
        status=status,
        detail=detail,
        instance=request.url.path,
    )
    return JSONResponse(body.model_dump(exclude_none=True), status, media_type=PROBLEM_JSON)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """An outage of Postgres or NATS is a 503 with `Retry-After`; anything else is a bug."""
    if is_outage(exc):
        log.warning("dependency unavailable on %s: %r", request.url.path, exc)
        return problem_response(
            request, ErrorCode.UNAVAILABLE, "a backing service is unavailable; retry later"
        )
    log.exception("unexpected error on %s", request.url.path, exc_info=exc)
    return problem_response(request, ErrorCode.INTERNAL, "internal error; see the api logs")


def _field_error(error: Any) -> FieldError:
    """`("body", "vcore")` → `vcore`; a body that is not JSON → `body`."""
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "header")]
    if error.get("type") == "json_invalid":
        loc = []
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")  # pydantic's
    return FieldError(field=".".join(loc) or "body", message=message)


def _documented(code: ErrorCode) -> dict[str, Any]:
    schema = {"schema": {"$ref": "#/components/schemas/Problem"}}
    return {"model": Problem, "description": code.problem_title, "content": {PROBLEM_JSON: schema}}


PROBLEMS: dict[int | str, dict[str, Any]] = {
    code.status: _documented(code)
    for code in (
        ErrorCode.UNAUTHORIZED,
        ErrorCode.FORBIDDEN,
        ErrorCode.NOT_FOUND,
        ErrorCode.CONFLICT,
        ErrorCode.INVALID,
        ErrorCode.RATE_LIMITED,
        ErrorCode.UNAVAILABLE,
    )
}
"""The problem documents every authenticated route may answer, for OpenAPI."""
