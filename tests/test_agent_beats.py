"""The real `netval agent` process against a real broker (issue 23): on an unchanged host the
first cycle publishes the full report and the second a beat vouching for it (its digest), not
a second report; the beat is retained for an operator that subscribes later."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import aiomqtt
import pytest

import mosquitto
import netval
from netns import netval_script
from netval.model import Report
from netval.model.beat import Beat, material_content, report_digest
from test_agent import (
    LO_CHECKS,
    PREFIX,
    agent_config,
    next_message,
    stop_process,
    subscribed,
    tail,
    write_agent_files,
)

pytestmark = pytest.mark.timeout(60)


def _what_changed(messages: list[aiomqtt.Message]) -> str:
    """The material content of the reports that came instead of a beat, where it differs."""
    contents = [
        material_content(Report.model_validate_json(m.payload))
        for m in messages
        if isinstance(m.payload, bytes) and str(m.topic).endswith("/report")
    ]
    if len(contents) < 2:
        return f"{len(contents)} report(s)"
    first, second = contents[:2]
    return "; ".join(f"{k}: {first[k]!r} -> {second[k]!r}" for k in first if first[k] != second[k])


def _start_agent(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [netval_script(), "agent"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def test_an_unchanged_host_beats_on_its_second_cycle(
    tmp_path: Path, mosquitto_broker: mosquitto.MosquittoBroker
) -> None:
    env = write_agent_files(tmp_path, mosquitto_broker, agent_config(LO_CHECKS, interval="5s"))
    # the netval under test, whichever checkout the console script was installed from
    env["PYTHONPATH"] = str(Path(netval.__file__).resolve().parents[1])
    log_path = tmp_path / "agent.log"

    def diagnostics() -> str:
        return f"-- agent log --\n{tail(log_path)}\n-- broker log --\n{mosquitto_broker.log_text()}"

    async def until_beat() -> list[aiomqtt.Message]:
        got: list[aiomqtt.Message] = []
        async with subscribed(mosquitto_broker, f"{PREFIX}/report", f"{PREFIX}/beat") as sub:
            proc = _start_agent(env, log_path)
            try:
                # start jittered within the 5 s interval, the second cycle 5 s later
                deadline = time.monotonic() + 20
                while not any(str(m.topic).endswith("/beat") for m in got):
                    left = deadline - time.monotonic()
                    try:
                        got.append(await next_message(sub, max(left, 0.01)))
                    except TimeoutError:
                        raise AssertionError(
                            f"no beat within 20 s: {_what_changed(got)}\n{diagnostics()}"
                        ) from None
            finally:
                stop_process(proc)
        return got

    messages = asyncio.run(until_beat())
    assert [str(m.topic) for m in messages] == [f"{PREFIX}/report", f"{PREFIX}/beat"], diagnostics()
    report_payload, beat_payload = (m.payload for m in messages)
    assert isinstance(report_payload, bytes) and isinstance(beat_payload, bytes)
    report = Report.model_validate_json(report_payload)
    beat = Beat.model_validate_json(beat_payload)
    assert beat.digest == report_digest(report)
    assert (beat.seq, beat.worst) == (1, report.status)
    assert beat.cycle_at > report.started_at
    assert len(beat_payload) < 128
    assert (messages[1].qos, messages[1].retain) == (0, False)  # live: QoS 0

    async def retained() -> aiomqtt.Message:
        async with subscribed(mosquitto_broker, f"{PREFIX}/beat") as sub:
            return await next_message(sub, 3)

    late = asyncio.run(retained())
    assert late.retain and late.payload == beat_payload
