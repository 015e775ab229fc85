"""The Lease object: read it, create it, replace it (with its resourceVersion, so of two
replicas writing at once one gets 409 Conflict and loses).

Calls run on the elector's own threads (`thread_pools.Concern.LEASE`), closed with the client:
a few hung status or Node PATCHes, or TokenReviews, must not keep the leader from renewing."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netval.operator.thread_pools import Concern, ThreadPools

LEASE_API: Final = "coordination.k8s.io/v1"
MICROTIME: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def microtime(when: datetime) -> str:
    return when.astimezone(UTC).strftime(MICROTIME)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The spec of a Lease as the elector reads and writes it."""

    holder: str  # "" once released
    lease_duration: int  # seconds
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_api(cls, obj: dict[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


class LeaseConflict(Exception):
    """Someone else wrote the Lease since we read it (409), or created it first."""


class LeaseClient:
    def __init__(
        self, api_client: client.ApiClient, namespace: str, name: str, *, timeout: float
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.timeout = timeout
        self._api = client.CoordinationV1Api(api_client)
        # a call abandoned at its caller's deadline keeps its thread until its own timeout
        self._pools = ThreadPools({Concern.LEASE})

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            response = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            return dict(json.loads(response.data))

        # a hung call still ends by its own timeout; asyncio's bound keeps the caller's pace
        async with asyncio.timeout(self.timeout + 1.0):
            return await self._pools.run(Concern.LEASE, call)

    async def get(self) -> tuple[LeaseRecord, str] | None:
        """(record, resourceVersion), or None when there is no Lease."""
        try:
            obj = await self._call(self._api.read_namespaced_lease, self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return LeaseRecord.from_api(obj), str(obj["metadata"]["resourceVersion"])

    async def create(self, record: LeaseRecord) -> str:
        body = {
            "apiVersion": LEASE_API,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_spec(),
        }
        try:
            obj = await self._call(self._api.create_namespaced_lease, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict("the Lease was created by another replica") from None
            raise
        return str(obj["metadata"]["resourceVersion"])

    async def replace(self, record: LeaseRecord, resource_version: str) -> str:
        body = {
            "apiVersion": LEASE_API,
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": resource_version,
            },
            "spec": record.to_spec(),
        }
        try:
            obj = await self._call(
                self._api.replace_namespaced_lease, self.name, self.namespace, body
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict("the Lease was written by another replica") from None
            raise
        return str(obj["metadata"]["resourceVersion"])

    def close(self) -> None:
        self._pools.close()
