"""Storage reachability probes: `storage.reachable`, `storage.latency`, `storage.throughput`.

One short, protocol-aware exchange per endpoint proves that the storage service itself answers,
not only that some kernel accepted a TCP connection (a hung daemon behind a live socket is the
failure that matters):

- `tcp`: TCP connect; the endpoint must name a port.
- `ceph`: read the messenger banner a Ceph daemon sends on accept: msgr2 `ceph v2\\n` + le16
  payload length + le64 supported + le64 required features (`CEPH_BANNER_V2_PREFIX`, ceph
  src/include/msgr.h and ProtocolV2::_banner_exchange), or the legacy msgr1 `ceph v027`
  (`CEPH_BANNER`). Default port 3300 (IANA msgr2); the legacy monitor port is 6789.
- `nfs`: ONC RPC (RFC 5531) NULL call, program 100003 version 3 (retried as version 4 when the
  server answers PROG_MISMATCH and offers 4), over TCP with record marking (RFC 5531 section 11);
  default port 2049. Only an accepted reply with SUCCESS and the call's xid passes.
- `s3` / `http`: HTTP/1.1 HEAD of `path` (or `/`). s3: any status below 500 passes, since an
  unauthenticated S3 request answers 403. http: with a path, 2xx/3xx passes; without one, any
  status below 500 (the server is up). Plain HTTP, except on port 443: TLS with the system trust
  store and host name verification. Default port 80.

`storage.latency` is the time from the start of the TCP connect to the end of that exchange
(TLS handshake included), so it measures the service, not just the SYN/ACK; DNS time is not
included. For NFS servers without version 3 it includes the retried call.

`storage.throughput` (s3/http endpoints with `path` and `minThroughputMBps`) reads up to
`THROUGHPUT_MAX_BYTES` of the object with a ranged GET, for at most `THROUGHPUT_MAX_SECONDS`,
and reports MB/s = 10^6 bytes per second over the body transfer. It reads in this node's
wall-clock storage slots (`slots`, `netval.model.storage_slots`): at most
`maxConcurrentProbes` agents of a validation read one endpoint at once.

Host names and paths come from users: they are validated and never reach a shell; paths are
percent-encoded so they cannot inject header lines.

Modules: `target` (validation), `net` (DNS/TCP/TLS), `ceph`, `nfs`, `http` (one per
protocol), `reach` (timed exchange), `throughput`, `slots` (when to read), `judge` (results);
this one is the entry.
"""

from __future__ import annotations

import asyncio
from typing import Final

from netval.agent.storage.judge import endpoint_result, reach_results, unjudged
from netval.agent.storage.reach import reach_target
from netval.agent.storage.slots import SlotReader
from netval.agent.storage.target import target_of
from netval.agent.storage.throughput import throughput_result, throughput_skip_reason
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import StorageChecks, StorageEndpoint

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "StorageProber",
    "probe_endpoint",
    "probe_storage",
]

DEFAULT_TIMEOUT_SECONDS: Final = 5.0


async def _probe(
    endpoint: StorageEndpoint, *, measure_throughput: bool, phase_timeout: float
) -> list[CheckResult]:
    try:
        target = target_of(endpoint)
    except ValueError as exc:
        return [
            endpoint_result(
                CheckId.STORAGE_REACHABLE,
                endpoint,
                Status.ERROR,
                f"invalid endpoint: {exc}",
            ),
            *unjudged(endpoint, "invalid endpoint"),
        ]
    reach = await reach_target(target, phase_timeout)
    throughput = await throughput_result(
        endpoint, target, reach, measure=measure_throughput, phase_timeout=phase_timeout
    )
    return [*reach_results(endpoint, reach), throughput]


async def probe_endpoint(
    endpoint: StorageEndpoint,
    *,
    measure_throughput: bool,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 - a per-phase bound, not one deadline
) -> list[CheckResult]:
    """storage.reachable, storage.latency and storage.throughput for one endpoint, in that order.

    `timeout` bounds each network phase (the reachability exchange; the throughput request up
    to its response headers, and any stall while reading the body). Never raises for network
    or endpoint problems: they are fail/error results.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    try:
        return await _probe(endpoint, measure_throughput=measure_throughput, phase_timeout=timeout)
    except Exception as exc:  # the contract: a probe bug is a result, not a dead agent cycle
        return [
            endpoint_result(
                CheckId.STORAGE_REACHABLE,
                endpoint,
                Status.ERROR,
                f"probe failed unexpectedly: {type(exc).__name__}: {exc}",
            ),
            *unjudged(endpoint, "the probe failed"),
        ]


async def probe_storage(
    checks: StorageChecks,
    *,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 - see probe_endpoint
) -> list[CheckResult]:
    """All endpoints concurrently, results in endpoint order; throughput is not read here
    (it is read in the node's storage slots, `StorageProber`)."""
    per_endpoint = await asyncio.gather(
        *(
            probe_endpoint(endpoint, measure_throughput=False, timeout=timeout)
            for endpoint in checks.endpoints
        )
    )
    return [result for results in per_endpoint for result in results]


class StorageProber:
    """Storage results of a probe cycle: reachability and latency probed now, throughput as
    last read in this node's storage slot (`slots`, which runs the reads on its own task).

    Between slots the last measured figure stands, so the check neither vanishes nor flaps to
    skip; before the first slot it is a skip that says when the slot comes.
    """

    def __init__(self, slots: SlotReader) -> None:
        self.slots = slots

    async def probe(
        self,
        checks: StorageChecks,
        *,
        interval_seconds: float,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 - see probe_endpoint
    ) -> list[CheckResult]:
        results = await probe_storage(checks, timeout=timeout)
        by_name = {e.name: e for e in checks.endpoints}
        reachable = {
            r.subject: r.status is Status.PASS
            for r in results
            if r.check is CheckId.STORAGE_REACHABLE
        }
        out: list[CheckResult] = []
        for r in results:
            endpoint = by_name.get(r.subject)
            if r.check is CheckId.STORAGE_THROUGHPUT and endpoint is not None:
                r = self._throughput(endpoint, r, checks, interval_seconds, reachable[r.subject])
            out.append(r)
        return out

    def _throughput(
        self,
        endpoint: StorageEndpoint,
        probed: CheckResult,
        checks: StorageChecks,
        interval_seconds: float,
        reachable: bool,
    ) -> CheckResult:
        if throughput_skip_reason(endpoint) is not None:
            return probed  # the spec leaves it unmeasured: say why
        kept = self.slots.kept(endpoint)
        if kept is not None:
            return kept
        if not reachable:
            return probed  # "not measured: endpoint unreachable"
        return self.slots.waiting(endpoint, checks, interval_seconds)
