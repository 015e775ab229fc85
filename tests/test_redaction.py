"""No secret leaves netval: presigned storage paths, userinfo, passwords and tokens are masked
in results, reports, log lines, the operator's status and Events.

The storage endpoint is a real HTTP server on loopback that records what it was sent (so the
signature provably reached the server while no output shows it); the operator runs in
process against a stateful Kubernetes API with a real broker.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import string
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.agent.storage.probe import probe_endpoint
from netval.agent.storage.target import http_request_target, validate_host
from netval.cli import main
from netval.infra.log_redaction import install_log_redaction
from netval.model import CheckId, Report, Status
from netval.model.redaction import MASK, redact, redact_url
from netval.model.results import CheckResult
from netval.model.spec import StorageEndpoint
from netval.operator.term_runtime import OperatorRuntime
from operator_env import NODES, publish, validation, wait_status

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "status" / "roce-pool.yaml"
SIGNATURE = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
CREDENTIAL = "AKIAIOSFODNN7EXAMPLE%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
PRESIGNED = (
    f"/bucket/object?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={CREDENTIAL}"
    f"&X-Amz-Expires=900&X-Amz-Signature={SIGNATURE}"
)
SHOWN = "/bucket/object?X-Amz-Algorithm=…&X-Amz-Credential=…&X-Amz-Expires=…&X-Amz-Signature=…"
SECRETS = (SIGNATURE, "AKIAIOSFODNN7EXAMPLE")


def assert_clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


# ---------------------------------------------------------------- a real HTTP server


@asynccontextmanager
async def http_server(
    *, head: int, get: int, body: bytes = b"", answer: bool = True
) -> AsyncIterator[tuple[int, list[str]]]:
    """Answers HEAD with `head` and GET with `get`; records each request line."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode("latin-1").strip()
            seen.append(line)
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            if not answer:
                await reader.read()  # hold the connection until the client gives up
                return
            status = head if line.startswith("HEAD") else get
            payload = b"" if line.startswith("HEAD") else body
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Length: {len(payload)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1], seen


def _endpoint(protocol: str, port: int, path: str, **extra: float) -> StorageEndpoint:
    return StorageEndpoint(
        name=f"{protocol}-presigned",
        protocol=protocol,
        host="127.0.0.1",
        port=port,
        path=path,
        max_latency_ms=5000.0,
        **extra,
    )


async def _probe_all() -> tuple[list[CheckResult], list[str]]:
    results: list[CheckResult] = []
    requests: list[str] = []
    # http: a configured path must answer 2xx/3xx, so a 403 fails and quotes the request
    async with http_server(head=403, get=403) as (port, seen):
        results += await probe_endpoint(_endpoint("http", port, PRESIGNED), measure_throughput=True)
        requests += seen
    # s3: HEAD passes, the ranged GET is refused (the throughput message quotes the GET)
    async with http_server(head=200, get=403) as (port, seen):
        ep = _endpoint("s3", port, PRESIGNED, min_throughput_m_bps=1.0)
        results += await probe_endpoint(ep, measure_throughput=True)
        requests += seen
    # s3: a body read succeeds (the throughput message names the object it read)
    async with http_server(head=200, get=200, body=b"x" * 4096) as (port, seen):
        ep = _endpoint("s3", port, PRESIGNED, min_throughput_m_bps=1e-9)
        results += await probe_endpoint(ep, measure_throughput=True)
        requests += seen
    # a server that never answers: the timeout message names the step it was waiting in
    async with http_server(head=200, get=200, answer=False) as (port, seen):
        results += await probe_endpoint(
            _endpoint("http", port, PRESIGNED), measure_throughput=False, timeout=0.5
        )
        requests += seen
    # a path the probe refuses (no leading "/"): the error quotes it
    results += await probe_endpoint(
        _endpoint("http", 9, PRESIGNED.lstrip("/")), measure_throughput=False
    )
    return results, requests


def test_presigned_storage_path_is_sent_but_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    results, requests = asyncio.run(_probe_all())

    # the server got the real signature: the probe used the presigned path as configured
    assert requests and all(SIGNATURE in line for line in requests), requests
    messages = [r.message for r in results]
    assert any(f"HEAD {SHOWN} answered 403" in m for m in messages), messages
    assert any(f"GET {SHOWN} answered 403" in m for m in messages), messages
    assert any(f"bytes of {SHOWN}" in m for m in messages), messages
    assert any(f"HEAD {SHOWN}" in m and "timed out" in m for m in messages), messages
    assert any("path must start with '/'" in m for m in messages), messages

    report = Report(
        validation="pool-a",
        generation=1,
        node="gpu-a",
        started_at=datetime.now(UTC),
        duration_ms=1.0,
        status=Status.FAIL,
        results=results,
    )
    assert_clean(report.to_json())
    assert_clean(json.dumps([r.model_dump(mode="json") for r in results]))
    for record in caplog.records:
        assert_clean(record.getMessage())


def test_a_result_never_holds_a_secret_however_it_is_made() -> None:
    # what an older or hostile agent could put in a report: redacted when parsed, too
    raw = {
        "check": "storage.reachable",
        "subject": "s3",
        "status": "fail",
        "message": f"GET https://admin:hunter2@s3.local{PRESIGNED} with password=hunter2 failed",
    }
    parsed = CheckResult.model_validate_json(json.dumps(raw))
    assert parsed.message == f"GET https://…@s3.local{SHOWN} with password=… failed"
    # a mask can be longer than what it hides: the bound still holds
    long = CheckResult(
        check=CheckId.STORAGE_REACHABLE,
        subject="s3",
        status=Status.FAIL,
        message="?" + "&".join(["a="] * 340),
    )
    assert len(long.message) <= 1024 and "=" not in long.message.replace(f"={MASK}", "")


def test_host_and_path_errors_do_not_echo_credentials() -> None:
    with pytest.raises(ValueError) as host_error:
        validate_host("admin:hunter2@s3.local")
    assert "hunter2" not in str(host_error.value) and "s3.local" in str(host_error.value)
    with pytest.raises(ValueError) as path_error:
        http_request_target(PRESIGNED.lstrip("/"))
    assert_clean(str(path_error.value))


# ---------------------------------------------------------------- logs


def test_log_filter_redacts_messages_arguments_and_tracebacks() -> None:
    logger = logging.getLogger("netval.test.redaction")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        install_log_redaction(logger)
        install_log_redaction(logger)  # idempotent: one filter per handler
        assert len(handler.filters) == 1
        logger.warning("GET %s failed", PRESIGNED)
        logger.warning("connecting with token=%s", "s3cr3t-token")
        try:
            raise RuntimeError(f"Authorization: Bearer eyJhbGciOi.{SIGNATURE}")
        except RuntimeError:
            logger.exception("upload of %s", "https://u:hunter2@h/x")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    out = stream.getvalue()
    assert_clean(out)
    assert "s3cr3t-token" not in out and "hunter2" not in out
    assert f"GET {SHOWN} failed" in out and "token=…" in out and "Bearer …" in out
    assert "RuntimeError" in out  # the traceback is kept, only its secrets go


# ---------------------------------------------------------------- operator status and Events


def test_operator_status_and_events_never_show_a_signature(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    cluster.create(validation())
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 4, "4 targeted nodes")
    # An agent that does not redact (an older version, or a hostile one): the raw JSON, not
    # netval's model, so nothing on the sending side masks it.
    failing = {
        "check": "storage.reachable",
        "subject": "s3-presigned",
        "status": "fail",
        "message": f"HEAD {PRESIGNED} answered 403 Forbidden from 10.0.0.9:80",
        "observed": {"reachable": False},
        "expected": {"reachable": True},
    }
    body = {
        "schema": "netval.io/report/v1",
        "validation": "pool-a",
        "generation": 1,
        "node": NODES[0],
        "startedAt": datetime.now(UTC).isoformat(),
        "durationMs": 1.0,
        "status": "fail",
        "results": [failing],
    }
    publish(mosquitto_broker, [(f"netval/v1/pool-a/{NODES[0]}/report", json.dumps(body).encode())])
    status = wait_status(cluster, lambda s: s["nodes"]["failing"] == 1, "the node failing")
    (failure,) = status["failures"]
    assert failure["message"] == f"HEAD {SHOWN} answered 403 Forbidden from 10.0.0.9:80"
    assert_clean(json.dumps(status))
    events = wait_for(
        lambda: [e for e in cluster.list("v1", "events", "default")
                 if e.get("reason") == "CheckFailing"],
        what="CheckFailing event",
    )  # fmt: skip
    assert_clean(json.dumps(events))
    for record in caplog.records:
        assert_clean(record.getMessage())


def test_html_report_and_status_view_of_an_unredacted_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`netval report --from` / `netval status --from` of an object an older operator wrote
    with the signature in its failures and conditions: neither output shows it."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["status"]["failures"][0]["message"] = f"HEAD {PRESIGNED} answered 403 Forbidden"
    for condition in obj["status"]["conditions"]:
        if condition["type"] == "Healthy":
            condition["message"] += f"; storage: GET {PRESIGNED} answered 403"
    source = tmp_path / "nv.yaml"
    source.write_text(yaml.safe_dump(obj))
    html = tmp_path / "report.html"
    assert main(["report", "--from", str(source), "--html", str(html)]) == 1  # not healthy
    page = html.read_text()
    assert_clean(page)
    assert "X-Amz-Signature=…" in page
    main(["status", "--from", str(source), "--nodes", "--failing"])
    out = capsys.readouterr().out
    assert_clean(out)


# ---------------------------------------------------------------- the redactor, fuzzed

_PARAM_SHOWN = r"(?:[A-Za-z][A-Za-z0-9._-]{0,63}=…|…)"
_QUERY_SHOWN = re.compile(rf"{_PARAM_SHOWN}(?:&{_PARAM_SHOWN})*")
_PATH_CHARS = string.ascii_letters + string.digits + "/-._~"


# No deadline: the 2 shared CI cores make per-example timing meaningless.
@settings(deadline=None)
@given(st.text())
def test_redactors_are_total(text: str) -> None:
    assert isinstance(redact(text), str)
    assert isinstance(redact_url(text), str)


@settings(deadline=None)
@given(st.text())
def test_redact_url_shows_only_parameter_names(url: str) -> None:
    shown = redact_url(url)
    if "?" in url:
        query = shown.partition("?")[2]
        assert query == MASK or _QUERY_SHOWN.fullmatch(query), shown


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.text(alphabet=_PATH_CHARS, max_size=40),
    params=st.lists(st.tuples(st.text(min_size=1, max_size=20), st.text(min_size=1)), max_size=6),
    before=st.text(max_size=40),
    after=st.text(max_size=40),
)
def test_no_query_value_survives_in_a_message(
    path: str, params: list[tuple[str, str]], before: str, after: str
) -> None:
    # A request target as the probe sends it (values encoded as a presigner does), quoted
    # inside arbitrary text.
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params)
    target = http_request_target("/" + path + ("?" + query if query else ""))
    message = f"{before} {target} {after}"
    values = [quote(v, safe="") for _, v in params]
    for value in values:
        assume(f"={value}" not in before + after)
    shown = redact(message)
    for value in values:
        assert f"={value}" not in shown, (message, shown)
    assert redact(shown) == shown  # masking twice changes nothing
