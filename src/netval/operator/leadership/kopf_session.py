"""Kopf's own writes (finalizers, its annotations, Events of handler warnings) ask the write
fence too: Kopf talks to the API through its own aiohttp session, not the kubernetes client,
so its login gives it a session whose every write request checks the fence when it starts
(before a connection is taken). Same credentials as Kopf's default login (in-cluster, else
KUBECONFIG)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiohttp
import kopf

from netval.operator.leadership.fence import WRITE_FENCE

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


async def _check_fence(
    _session: aiohttp.ClientSession,
    _context: SimpleNamespace,
    params: aiohttp.TraceRequestStartParams,
) -> None:
    method = params.method.upper()
    if method in WRITE_METHODS:
        WRITE_FENCE.write_timeout(f"{method} {params.url.path}")  # raises NotLeading


def fenced_trace() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(_check_fence)
    return trace


@kopf.on.login()
async def login_fenced(**kwargs: Any) -> kopf.AiohttpSession | None:
    info = kopf.login_via_client(**kwargs)
    if info is None:
        return None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        trust_env=info.trust_env,
        trace_configs=[fenced_trace()],
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )
