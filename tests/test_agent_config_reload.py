"""A mounted ConfigMap changes under a running agent: good updates apply, bad ones don't."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from netval.agent.collect.live import LiveCollector
from netval.agent.config import AgentConfig, load_agent_config
from netval.agent.config_watch import ConfigWatcher
from netval.agent.runner import ProbeRunner
from netval.model import CheckId, Report, Status


def write_config(path: Path, generation: int, checks: dict[str, object], **extra: object) -> None:
    doc = {"validation": "pool-a", "generation": generation,
           "spec": {"interval": "30s", "checks": checks}, **extra}  # fmt: skip
    path.write_text(json.dumps(doc))


class Sink:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    async def publish(self, report: Report) -> None:
        self.reports.append(report)


def test_good_update_applies_bad_update_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    write_config(path, 1, {"link": {"interfaces": ["lo"]}})
    applied: list[AgentConfig] = []
    watcher = ConfigWatcher(path, load_agent_config(path), applied.append)

    watcher.check()  # unchanged file: nothing happens
    assert applied == [] and watcher.reloads == 0

    write_config(path, 2, {"link": {"interfaces": ["lo"]}, "mtu": {"interfaces": ["lo"]}})
    watcher.check()
    assert [c.generation for c in applied] == [2]
    assert watcher.current.spec.checks.mtu.interfaces == ["lo"]

    path.write_text('{"validation": "pool-a", "generation": 3, "spec": {"checks": {"pfc": '
                    '{"priorities": [9]}}}}')  # fmt: skip
    watcher.check()
    assert watcher.failures == 1
    assert watcher.last_error is not None
    assert "field spec.checks.pfc.priorities.0" in watcher.last_error
    assert watcher.current.generation == 2  # the last good config stays in force
    assert len(applied) == 1

    write_config(path, 4, {}, validation="pool-b")
    watcher.check()
    assert watcher.failures == 2
    assert "restart the agent to switch validations" in (watcher.last_error or "")

    write_config(path, 5, {"link": {"interfaces": ["lo"]}})
    watcher.check()
    assert [c.generation for c in applied] == [2, 5]
    assert watcher.last_error is None


def test_runner_uses_the_reloaded_checks(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    write_config(path, 1, {"link": {"interfaces": ["lo"]}})
    config = load_agent_config(path)
    sink = Sink()
    with LiveCollector(interfaces=config.spec.checks.named_interfaces) as collector:
        runner = ProbeRunner(
            config=config, node="n1", collector=collector, sink=sink,
            tracer_provider=TracerProvider(),
        )  # fmt: skip
        watcher = ConfigWatcher(path, config, runner.apply_config)

        async def cycle_twice() -> None:
            await runner.probe_once()
            write_config(path, 2, {"mtu": {"interfaces": ["lo"], "interfaceMTU": 1500}})
            watcher.check()
            await runner.probe_once()

        asyncio.run(cycle_twice())
    first, second = sink.reports
    assert (first.generation, second.generation) == (1, 2)

    def judged(report: Report, check: CheckId) -> dict[str, Status]:
        return {r.subject: r.status for r in report.results if r.check is check}

    assert judged(first, CheckId.LINK_CARRIER) == {"lo": Status.PASS}
    assert judged(second, CheckId.MTU_INTERFACE) == {"lo": Status.FAIL}  # lo is 65536
    assert "lo" not in judged(second, CheckId.LINK_CARRIER)
