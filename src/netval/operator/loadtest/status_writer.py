"""Writes a NetworkLoadTest's status: a merge patch of the status subresource, only when it
differs from what was last written, one attempt (the coordinator asks again at its next
tick with what it knows then; through the term's fenced client, so only the leader writes)."""

from __future__ import annotations

import logging

from kubernetes.client.exceptions import ApiException

from netval.model.loadtest import NetworkLoadTestStatus
from netval.operator.kube.api import KubeApi, error_text

log = logging.getLogger("netval.operator.loadtest")


class LoadStatusWriter:
    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.failures = 0
        self._written: dict[str, dict[str, object]] = {}

    async def write(self, name: str, status: NetworkLoadTestStatus) -> None:
        patch = status.to_patch()
        if self._written.get(name) == patch:
            return
        try:
            await self.kube.patch_loadtest_status(name, patch)
        except ApiException as exc:
            if exc.status != 404:  # 404: deleted meanwhile
                self._failed(name, exc)
            return
        except Exception as exc:
            self._failed(name, exc)
            return
        self._written[name] = patch

    def forget(self, name: str) -> None:
        self._written.pop(name, None)

    def _failed(self, name: str, exc: BaseException) -> None:
        self.failures += 1
        log.warning("NetworkLoadTest %s status: %s", name, error_text(exc))
