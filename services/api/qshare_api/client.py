"""A small synchronous client of the REST API, used by the CLI."""

from __future__ import annotations

from typing import Any

import httpx


class ApiError(Exception):
    """A problem document the API answered with."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(problem.get("detail", f"HTTP {status}"))
        self.status = status
        self.problem = problem


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self._call("GET", path, params=clean)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("POST", path, json=body)

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"detail": response.text}
            raise ApiError(response.status_code, problem)
        return response.json() if response.content else None
