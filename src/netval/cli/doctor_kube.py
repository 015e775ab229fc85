"""`netval doctor`'s one way to ask the Kubernetes API: a request, its status and JSON body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KubeReader:
    """Requests through the official client's connection pool (its TLS, client certificates,
    proxy) and its auth settings (bearer token, refreshed by exec plugins), without its
    generated API layer, whose call signature differs between client versions."""

    def __init__(self, timeout: float) -> None:
        from kubernetes import client

        self.api = client.ApiClient()
        self.timeout = timeout

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    def call(self, method: str, path: str, body: Any = None,
             headers: Mapping[str, str] | None = None) -> tuple[int, Any]:  # fmt: skip
        """(HTTP status, parsed JSON body) of one request; status 0 when unreachable."""
        import json

        import urllib3

        cfg = self.api.configuration
        sent = {"Accept": "application/json", "Content-Type": "application/json", **(headers or {})}
        for auth in cfg.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                sent[str(auth["key"])] = str(auth["value"])
        try:
            resp = self.api.rest_client.pool_manager.request(
                method,
                f"{cfg.host.rstrip('/')}{path}",
                body=None if body is None else json.dumps(body).encode(),
                headers=sent,
                timeout=urllib3.Timeout(total=self.timeout),
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return 0, str(exc)
        try:
            return resp.status, json.loads(resp.data) if resp.data else None
        except ValueError:
            return resp.status, resp.data.decode(errors="replace")

    def get(self, path: str) -> tuple[int, Any]:
        return self.call("GET", path)
