"""Which validations' agents need perftest's privileges: the validations with an RDMA load
test (docs/loadtest.md, "Privileges"). Pure, with the registry the handlers keep.

An RDMA load test is a NetworkLoadTest whose east-west phase may run perftest: engine
`perftest`, or `auto` on a validation that expects RoCE or InfiniBand ports (its
`checks.rdma` link layers; auto picks perftest on the rails that are RDMA ports). Only
those validations' agent pods get `/dev/infiniband`, IPC_LOCK and the perftest binaries
that hold it (`netval.operator.agents.agent_pod`); every other agent keeps no capability.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from netval.model.loadtest import LoadEngine, LoadPhase, NetworkLoadTestSpec
from netval.model.spec import LinkLayer, NetworkValidationSpec

RDMA_LAYERS = frozenset({LinkLayer.ETHERNET, LinkLayer.INFINIBAND})


def needs_rdma(spec: NetworkLoadTestSpec, validation: NetworkValidationSpec | None) -> bool:
    if spec.phases is not None and LoadPhase.EAST_WEST not in spec.phases:
        return False
    engine = spec.east_west.engine
    if engine is LoadEngine.IPERF3:
        return False
    if engine is LoadEngine.PERFTEST:
        return True
    if validation is None:
        return False
    return validation.checks.peers.enabled and bool(
        RDMA_LAYERS & set(validation.checks.rdma.expected_link_layers)
    )


class RdmaLoadTests:
    """test -> (its validation, whether it is an RDMA load test), from the handlers."""

    def __init__(self) -> None:
        self._tests: dict[str, tuple[str, Mapping[str, Any]]] = {}

    def note(self, name: str, raw: Mapping[str, Any]) -> None:
        validation = raw.get("validation")
        if isinstance(validation, str):
            self._tests[name] = (validation, dict(raw))
        else:
            self._tests.pop(name, None)

    def forget(self, name: str) -> None:
        self._tests.pop(name, None)

    def validations(self, specs: Mapping[str, NetworkValidationSpec]) -> set[str]:
        """The validations with an RDMA load test (their specs as the store holds them)."""
        out: set[str] = set()
        for validation, raw in self._tests.values():
            try:
                spec = NetworkLoadTestSpec.model_validate(raw)
            except ValidationError:
                continue  # an invalid spec runs nothing
            if needs_rdma(spec, specs.get(validation)):
                out.add(validation)
        return out
