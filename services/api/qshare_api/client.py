"""A small synchronous client of the REST API, used by the CLI."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx

LOST = (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, httpx.TimeoutException)
"""Transport failures after which the request may or may not have been handled."""


class ApiError(Exception):
    """A problem document the API answered with."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(problem.get("detail", f"HTTP {status}"))
        self.status = status
        self.problem = problem


class NotTheApi(Exception):
    """An answer no qshare API gives (not JSON): the URL reaches another server (a proxy's
    login page, another web service)."""


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self._call("GET", path, params=clean)

    def post(self, path: str, body: dict[str, Any], idempotency_key: str | None = None) -> Any:
        """Every POST carries an `Idempotency-Key` (a fresh one unless given), and is sent
        once more with the same key when the connection fails before an answer came: a
        lost reply never creates a second claim."""
        key = idempotency_key or str(body.get("idempotency_key") or f"client-{uuid.uuid4()}")
        headers = {"Idempotency-Key": key}
        try:
            return self._call("POST", path, json=body, headers=headers)
        except LOST:
            return self._call("POST", path, json=body, headers=headers)

    def put(self, path: str, body: dict[str, Any]) -> Any:
        """PUT sets a whole resource: sending it again is harmless, so it is sent once more
        when the connection fails before an answer came."""
        return self._twice_if_lost("PUT", path, body)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        """qshare's PATCH bodies hold new values, not changes: sent once more, like PUT."""
        return self._twice_if_lost("PATCH", path, body)

    def _twice_if_lost(self, method: str, path: str, body: dict[str, Any]) -> Any:
        try:
            return self._call(method, path, json=body)
        except LOST:
            return self._call(method, path, json=body)

    def events(self, path: str, **params: Any) -> Iterator[tuple[str, str]]:
        """A server-sent event stream as (event, data) pairs, until the server ends it."""
        clean = {k: v for k, v in params.items() if v is not None}
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        with self._http.stream("GET", path, params=clean, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise _problem(response)
            event = ""
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    yield event, line.removeprefix("data: ")

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise _problem(response)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            raise _not_the_api(response) from None


def _problem(response: httpx.Response) -> ApiError:
    """The problem document; the body's text as its detail when it is none (not JSON, or
    JSON but no object: a proxy's answer)."""
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        problem = {"detail": response.text[:2000]}
    return ApiError(response.status_code, problem)


def _not_the_api(response: httpx.Response) -> NotTheApi:
    kind = response.headers.get("content-type", "no content type")
    start = response.text[:80]
    return NotTheApi(
        f"{response.request.url} answered {response.status_code} with something that is not "
        f"JSON ({kind}, beginning {start!r}): is the URL qshare's API?"
    )
