"""Shared-secret authentication for the data plane's Flight services (driver and dataset servers).

Example::

    server = flight.FlightServerBase(location, middleware={"auth": BearerTokenMiddlewareFactory(token, "driver")})
    client.do_action(action, bearer_options(token))
"""

from __future__ import annotations

import hmac
from typing import Any

import pyarrow.flight as fl


class BearerTokenMiddlewareFactory(fl.ServerMiddlewareFactory):
    """Rejects every call whose ``authorization`` header is not ``Bearer <token>`` (constant time)."""

    def __init__(self, token: str, service: str) -> None:
        super().__init__()
        self._expected = f"Bearer {token}".encode()
        self._service = service

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        for value in headers.get("authorization", []):
            raw = value if isinstance(value, bytes) else str(value).encode()
            if hmac.compare_digest(raw, self._expected):
                return None
        raise fl.FlightUnauthenticatedError(f"{self._service}: missing or wrong token (authorization: Bearer <token>)")


def bearer_options(token: str | None, timeout: float | None = None) -> fl.FlightCallOptions:
    """Call options carrying ``authorization: Bearer <token>`` (or none)."""
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return fl.FlightCallOptions(headers=headers, timeout=timeout)
