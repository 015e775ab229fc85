"""Broker restart under per-node identity: N simulated agents, one MQTT connection each,
every one enrolled at the operator's identity service; the broker is SIGKILLed and comes
back after --outage seconds. Measured: enrollment requests and credentials issued because
of the restart, sessions the restart's aftermath killed, and the time until every agent
holds a stable session again. Before/after side by side: the same scenario with the code of
another tree (--before, e.g. `git archive main src | tar -x -C /tmp/netval-main`).

Run from the repository root (mosquitto must be installed):

    mkdir -p /tmp/netval-main && git archive main src | tar -x -C /tmp/netval-main
    python bench/enrollment_storm.py --nodes 500 --before /tmp/netval-main/src

What runs, each in its own process:
- Broker: the chart's Mosquitto with the dynamic security plugin and its state file
  (tests/test_chart_broker.py `run_chart_broker`, plaintext listener: TLS handshakes would
  add the same CPU to both sides); SIGKILL, then the same configuration started again.
- Kubernetes API: bench/enrollment.py's stand-in (TokenReview and Pod reads over HTTP).
- Operator: `IdentityService` as `netval operator` runs it, from the tree under test, with
  its defaults (per-pod reissue limit included).
- Agents: N pairs of the tree's `Enroller` + `ReportPublisher` (`Enroller.keep`, as
  `netval agent` wires them), each with its own token file and connection.

A session is stable once it holds --hold seconds (default 10) without a disconnect; "all
stable" is the time from the broker's return until the last agent's last connect before
that quiet period. Figures go to docs/operations.md ("Per-node MQTT identity").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
NS: Final = "netval-system"
VALIDATION: Final = "bench"


def _tree(src: str) -> None:
    """Import netval from `src` (the tree under test), the test kits from this checkout."""
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, src)


# --- role: operator ----------------------------------------------------------------------


async def run_operator(args: argparse.Namespace, shared: dict[str, Any]) -> None:
    from datetime import timedelta

    from kubernetes import config as kube_config

    from netval.infra.mqtt_settings import MqttSettings
    from netval.operator.identity.review import PodTokenReviewer
    from netval.operator.identity.service import IdentityService, IdentitySettings

    api_client = kube_config.new_client_from_config(config_file=shared["kubeconfig"])
    mqtt = MqttSettings("127.0.0.1", args.mqtt_port, username="netval-operator",
                        password=shared["operator"], client_id="bench-operator")  # fmt: skip
    settings = IdentitySettings("127.0.0.1", 0, Path(shared["cert"]), Path(shared["key"]),
                                timedelta(hours=24), Path(shared["ca"]))  # fmt: skip
    service = IdentityService(settings, mqtt, PodTokenReviewer(api_client, namespace=NS))
    service.issuer.validations_of = lambda node: {VALIDATION}  # no runtime: it targets all
    port = await service.start()
    out = Path(args.out)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        stats = {"port": port, "issued": service.issuer.issued,
                 "requests": sum(service.server.outcomes.values()),
                 "outcomes": dict(service.server.outcomes)}  # fmt: skip
        out.with_suffix(".tmp").write_text(json.dumps(stats))
        out.with_suffix(".tmp").replace(out)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    await service.stop()


# --- role: agents ------------------------------------------------------------------------


async def run_agents(args: argparse.Namespace, shared: dict[str, Any]) -> None:
    from netval.agent.enroll import Enroller, EnrollSettings
    from netval.agent.publish import ReportPublisher
    from netval.infra.mqtt_settings import MqttSettings

    tokens: dict[str, str] = shared["tokens"]
    token_dir = Path(tempfile.mkdtemp(prefix="netval-storm-tokens-"))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    agents: list[tuple[str, Enroller, ReportPublisher]] = []
    for node, token in sorted(tokens.items()):
        (token_dir / node).write_text(token)
        enroller = Enroller(EnrollSettings(args.url, token_dir / node, Path(shared["ca"]), node))
        publisher = ReportPublisher(MqttSettings("127.0.0.1", args.mqtt_port, client_id=node),
                                    VALIDATION, node)  # fmt: skip
        agents.append((node, enroller, publisher))

    async def agent(enroller: Enroller, publisher: ReportPublisher) -> None:
        credential = await enroller.enroll_until(stop)
        if credential is None:
            return
        publisher.settings = credential.apply(publisher.settings)
        await publisher.start()
        await enroller.keep(publisher, stop)

    tasks = [asyncio.create_task(agent(e, p)) for _, e, p in agents]
    events: list[tuple[float, int, int]] = []  # (monotonic, agent, 1 connected / 0 lost)
    state = [False] * len(agents)
    out = Path(args.out)
    last_write = 0.0
    while not stop.is_set():
        now = time.monotonic()
        for i, (_, _, publisher) in enumerate(agents):
            if publisher.connected != state[i]:
                state[i] = publisher.connected
                events.append((now, i, int(state[i])))
        if now - last_write >= 0.2:
            last_write = now
            status = {"connected": sum(state), "enrollments": sum(e.enrollments for _, e, _ in agents),
                      "last_event": events[-1][0] if events else 0.0}  # fmt: skip
            out.with_suffix(".tmp").write_text(json.dumps(status))
            out.with_suffix(".tmp").replace(out)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)
    await asyncio.gather(*(p.stop() for _, _, p in agents), return_exceptions=True)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    out.with_suffix(".events").write_text(json.dumps(events))


# --- the bench ---------------------------------------------------------------------------


def _read(path: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except (OSError, ValueError):
        return {}


def _wait(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def scenario(args: argparse.Namespace, src: str, label: str) -> dict[str, float]:
    from identity_kit import BrokerRestarts
    from netval.operator.kube import certs
    from test_chart_broker import plaintext_listener, run_chart_broker

    work = Path(tempfile.mkdtemp(prefix=f"netval-storm-{label}-"))
    (work / "broker").mkdir()
    tls = certs.generate_self_signed(work / "tls", ["127.0.0.1"])
    tokens_file = work / "tokens.json"
    env = {**os.environ, "PYTHONPATH": src}
    procs: list[subprocess.Popen[bytes]] = []
    kube = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "enrollment.py"), "--role", "kube",
         "--nodes", str(args.nodes), "--workdir", str(work / "kube"), "--out", str(tokens_file)],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait("the Kubernetes stand-in", tokens_file.exists, 300)
        with run_chart_broker(work / "broker", plaintext_listener) as (port, secrets):
            broker = BrokerRestarts(work / "broker", port)
            shared = {**json.loads(tokens_file.read_text()), "operator": secrets["operator"],
                      "cert": str(tls.cert), "key": str(tls.key), "ca": str(tls.ca)}  # fmt: skip
            (work / "shared.json").write_text(json.dumps(shared))
            me = [sys.executable, __file__, "--shared", str(work / "shared.json"),
                  "--mqtt-port", str(port), "--src", src]  # fmt: skip
            op_out, agents_out = work / "operator.json", work / "agents.json"
            procs.append(
                subprocess.Popen([*me, "--role", "operator", "--out", str(op_out)], env=env)
            )
            _wait("the operator", lambda: _read(op_out).get("port"), 60)
            url = f"https://127.0.0.1:{_read(op_out)['port']}/v1/enroll"
            procs.append(subprocess.Popen(
                [*me, "--role", "agents", "--url", url, "--out", str(agents_out)], env=env
            ))  # fmt: skip
            start = time.monotonic()
            _wait("every agent connected",
                  lambda: _read(agents_out).get("connected") == args.nodes, 900)  # fmt: skip
            first = time.monotonic() - start
            _wait("a quiet fleet", lambda: time.monotonic() - _read(agents_out)["last_event"]
                  >= args.hold, 300)  # fmt: skip
            before_op, before_agents = _read(op_out), _read(agents_out)
            broker.kill()
            killed = time.monotonic()
            time.sleep(args.outage)  # the scenario: the broker is away this long
            broker.start()
            up = time.monotonic()
            _wait("every agent connected again",
                  lambda: _read(agents_out).get("connected") == args.nodes, 900)  # fmt: skip
            _wait("a quiet fleet again", lambda: time.monotonic() - _read(agents_out)["last_event"]
                  >= args.hold, 900)  # fmt: skip
            after_op, after_agents = _read(op_out), _read(agents_out)
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
            broker.close()
        events = json.loads(agents_out.with_suffix(".events").read_text())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        if kube.stdin is not None:
            kube.stdin.close()
        kube.wait(30)
    last: dict[int, float] = {}  # agent -> its last connect (the stable session's start)
    for t, i, c in events:
        if t >= killed and c == 1:
            last[i] = t
    stable = sorted(t - up for t in last.values())
    return {
        "first enrollment s": first,
        "requests": after_op["requests"] - before_op["requests"],
        "issued": after_op["issued"] - before_op["issued"],
        "agent enrollments": after_agents["enrollments"] - before_agents["enrollments"],
        "sessions lost after return": sum(1 for t, _, c in events if c == 0 and t >= up),
        "stable, p50 s": stable[len(stable) // 2],
        "stable, p90 s": stable[int(len(stable) * 0.9)],
        "all stable s": stable[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--outage", type=float, default=5.0)
    parser.add_argument("--hold", type=float, default=10.0)
    parser.add_argument("--before", help="src/ of the tree to compare with (e.g. main's)")
    parser.add_argument("--role", choices=("bench", "operator", "agents"), default="bench")
    parser.add_argument("--src", default=str(ROOT / "src"))
    parser.add_argument("--shared")
    parser.add_argument("--mqtt-port", type=int)
    parser.add_argument("--url")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.role != "bench":
        _tree(args.src)
        logging.disable(logging.WARNING)  # thousands of agents' reconnect warnings
        shared = json.loads(Path(args.shared).read_text())
        asyncio.run((run_operator if args.role == "operator" else run_agents)(args, shared))
        return
    _tree(str(ROOT / "src"))
    import mosquitto

    if not mosquitto.available():
        sys.exit(mosquitto.MISSING_REASON)
    runs: dict[str, dict[str, float]] = {}
    if args.before:
        runs["before"] = scenario(args, args.before, "before")
    runs["after (this tree)"] = scenario(args, str(ROOT / "src"), "after")
    print(f"broker SIGKILL, back after {args.outage:g} s, {args.nodes} agents, one connection "
          f"each (chart's Mosquitto, dynamic security); stable = {args.hold:g} s without a "
          "disconnect")  # fmt: skip
    keys = list(next(iter(runs.values())))
    print(f"{'':>28}" + "".join(f"{k:>20}" for k in runs))
    for key in keys:
        print(f"{key:>28}" + "".join(f"{r[key]:>20.1f}" for r in runs.values()))


if __name__ == "__main__":
    main()
