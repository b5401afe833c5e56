"""A small synchronous client of the REST API, used by the CLI."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

LOST = (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, httpx.TimeoutException)
"""Transport failures after which the request may or may not have been handled."""
PAGE = 500
"""Items per page when the client reads a whole list (the API's most)."""


class ApiError(Exception):
    """A problem document the API answered with."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(problem.get("detail", f"HTTP {status}"))
        self.status = status
        self.problem = problem


class NotTheApi(Exception):
    """An answer no qshare API gives (not JSON): the URL reaches another server (a proxy's
    login page, another web service)."""


def segment(name: str) -> str:
    """`name` as one segment of a path: `?`, `#`, `/` and `%` encoded, and the dots of `..`
    too (a client would resolve it), so a tenant `team?a` is never the tenant `team`."""
    return quote(name, safe="").replace(".", "%2E")


class BadConnectionSetting(ValueError):
    """The API's URL or the token cannot be used at all (named before anything is sent)."""


_PASSWORD = re.compile(r"(//[^/@:]*:)[^/@]*@")


def redacted(url: object) -> str:
    """`url` as messages show it: a password in it as `***`."""
    return _PASSWORD.sub(r"\1***@", str(url))


def checked_url(url: str) -> str:
    """`url` if it is an http(s) URL naming a host and a port in range; else why not."""
    named = f"the API URL {redacted(url)!r} (--url or $QSHARE_URL)"
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BadConnectionSetting(f"{named} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise BadConnectionSetting(f"{named} is not an http:// or https:// URL")
    if not parsed.host:
        raise BadConnectionSetting(f"{named} names no host")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise BadConnectionSetting(f"{named}: port {parsed.port} is not in 1-65535")
    return url


def checked_token(token: str) -> str:
    """`token` if an HTTP header can carry it; else which character cannot (the token itself,
    a secret, is not shown)."""
    for at, char in enumerate(token, start=1):
        if not char.isascii():
            what = "a character that is not ASCII"
        elif not char.isprintable():
            what = "a control character"
        else:
            continue
        raise BadConnectionSetting(
            f"the token (--token or $QSHARE_TOKEN) holds {what} (character {at}); "
            "a qshare token is the qs_... text `qshare tokens create` printed"
        )
    return token


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {checked_token(token)}"} if token else {}
        base = checked_url(url).rstrip("/")
        self._http = httpx.Client(base_url=base, headers=headers, timeout=timeout)

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self._call("GET", path, params=clean)

    def every(self, path: str, **params: Any) -> list[Any]:
        """Every item of a list the API answers in pages (`limit`, and the next page's
        address in the Link header), page after page."""
        clean = {k: v for k, v in params.items() if v is not None} | {"limit": PAGE}
        items: list[Any] = []
        while True:
            response = self._http.request("GET", path, params=clean)
            items.extend(_json(response))
            following = response.links.get("next", {}).get("url")
            if not (cursor := following and httpx.URL(following).params.get("cursor")):
                return items
            clean["cursor"] = cursor

    def post(
        self,
        path: str,
        body: dict[str, Any],
        idempotency_key: str | None = None,
        again: bool = True,
    ) -> Any:
        """Every POST carries an `Idempotency-Key` (a fresh one unless given), and is sent
        once more with the same key when the connection fails before an answer came: a
        lost reply never creates a second claim. Without `again`, for a route that does not
        honour the key (a token's secret cannot be answered twice), it is sent once."""
        key = idempotency_key or str(body.get("idempotency_key") or f"client-{uuid.uuid4()}")
        headers = {"Idempotency-Key": key}
        try:
            return self._call("POST", path, json=body, headers=headers)
        except LOST:
            if not again:
                raise
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

    def events(self, path: str, **params: Any) -> Iterator[Event]:
        """A server-sent event stream, message by message, until the server ends it."""
        clean = {k: v for k, v in params.items() if v is not None}
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        with self._http.stream("GET", path, params=clean, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise _problem(response)
            if response.is_redirect:
                raise _redirected(response)
            yield from _messages(response.iter_lines())

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return _json(self._http.request(method, path, **kwargs))


@dataclass(frozen=True)
class Event:
    """One SSE message: `sequence` is its `id:` (None where the API sent none)."""

    sequence: int | None
    subject: str
    data: str


def _messages(lines: Iterator[str]) -> Iterator[Event]:
    """The messages of an event stream's lines (`id:`, `event:`, then `data:`); an `id:`
    alone (a stream that ended past events it did not show) is an Event with no subject."""
    sequence, subject = None, ""
    for line in lines:
        if not line and sequence is not None:  # the end of a message that had no data
            yield Event(sequence, "", "")
            sequence = None
        elif line.startswith("id: "):
            sequence = int(line[4:]) if line[4:].isdigit() else None
        elif line.startswith("event: "):
            subject = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield Event(sequence, subject, line.removeprefix("data: "))
            sequence = None


def _json(response: httpx.Response) -> Any:
    """What the API answered, or the error it is."""
    if response.status_code >= 400:
        raise _problem(response)
    if response.is_redirect:  # the API never redirects what the CLI asks
        raise _redirected(response)
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
        f"{redacted(response.request.url)} answered {response.status_code} with something that "
        f"is not JSON ({kind}, beginning {start!r}): is the URL qshare's API?"
    )


def _redirected(response: httpx.Response) -> NotTheApi:
    where = response.headers.get("location", "nowhere named")
    return NotTheApi(
        f"{redacted(response.request.url)} answered {response.status_code}, a redirect to "
        f"{redacted(where)}: "
        "is the URL qshare's API?"
    )
