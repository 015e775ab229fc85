"""Errors a newcomer meets in the first hour: one line on stderr, exit 2, saying what to fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netval.cli import main

REPO = Path(__file__).resolve().parents[1]
HEALTHY = REPO / "examples" / "snapshots" / "healthy-roce"
EXAMPLE_STATUS = REPO / "examples" / "status" / "roce-pool.yaml"


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("netval"), err
    return err


@pytest.mark.parametrize("out", ["/proc/netval-x", "/etc/hostname/x"])
def test_snapshot_out_cannot_be_created(out: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "--out", out, "--interval", "0"]) == 2
    assert f"--out {out}: cannot write" in one_line(capsys)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("clusters: [\n", "not a kubeconfig: invalid YAML"),
        ("just a text file\n", "not a kubeconfig (expected a YAML mapping"),
        ("clusters: []\ncontexts: []\nusers: []\n", "cannot use this kubeconfig"),
    ],
)
@pytest.mark.parametrize("command", [["status"], ["report", "x", "--html", "/tmp/x.html"]])
def test_malformed_kubeconfig_is_bad_input_not_unhealthy(
    command: list[str], content: str, expected: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    config = tmp_path / "kubeconfig"
    config.write_text(content)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert main(command) == 2
    err = one_line(capsys)
    assert expected in err and str(config) in err


def test_missing_kubeconfig_names_the_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    assert main(["status"]) == 2
    assert "KUBECONFIG=/nonexistent: no such file: /nonexistent" in one_line(capsys)
    assert main(["status", "--kubeconfig", "/nope/config"]) == 2
    assert "--kubeconfig /nope/config: no such file" in one_line(capsys)


def test_unknown_context(kube: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--context", "nope"]) == 2
    assert "cannot use this kubeconfig" in one_line(capsys)


def _operator(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("NETVAL_", "KUBE"))}  # fmt: skip
    full.update(env, HOME=str(tmp_path), PYTHONPATH=str(REPO / "src"))
    return subprocess.run([sys.executable, "-m", "netval.cli", "operator", "--standalone"],
                          env=full, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_operator_without_kube_configuration_exits_2_at_once(tmp_path: Path) -> None:
    proc = _operator({"NETVAL_MQTT_URL": "mqtt://127.0.0.1:1"}, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no Kubernetes configuration" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_operator_without_mqtt_settings_exits_2(tmp_path: Path) -> None:
    proc = _operator({}, tmp_path)
    assert proc.returncode == 2 and "NETVAL_MQTT_URL" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_operator_bad_log_level(tmp_path: Path) -> None:
    proc = _operator({"NETVAL_LOG_LEVEL": "chatty", "NETVAL_MQTT_URL": "mqtt://h"}, tmp_path)
    assert proc.returncode == 2 and "NETVAL_LOG_LEVEL" in proc.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"NETVAL_ACL_PROBE_PASSWORD_FILE": "/x"}, "NETVAL_ACL_PROBE_PASSWORD_FILE needs NETVAL_ACL_PROBE_USERNAME"),
        ({"NETVAL_ACL_PROBE_USERNAME": "gpu-a", "NETVAL_ACL_PROBE_PASSWORD_FILE": "/nonexistent/pw"},
         "NETVAL_ACL_PROBE_PASSWORD_FILE='/nonexistent/pw': cannot read"),
    ],
)  # fmt: skip
def test_operator_bad_acl_probe_login_exits_2_in_one_line(
    env: dict[str, str], expected: str, tmp_path: Path
) -> None:
    proc = _operator({"NETVAL_MQTT_URL": "mqtt://127.0.0.1:1", **env}, tmp_path)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [["probe", "--samples", "0"], ["nope"], [], ["status", "--bogus"], ["report"]],
)
def test_usage_errors_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "--help" in err, err


def test_empty_config_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing but a comment\n")
    assert main(["probe", "--from", str(HEALTHY), "--config", str(empty)]) == 2
    assert f"{empty}: empty" in one_line(capsys)


def test_unknown_fields_suggest_and_list_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mtu: {interfaceMtu: 9000}\npfc: {priorites: [3]}\necn: {priorities: [9]}\n")
    assert main(["probe", "--from", str(HEALTHY), "--config", str(cfg)]) == 2
    err = one_line(capsys)
    assert "field mtu.interfaceMtu: unknown field (did you mean interfaceMTU?)" in err
    assert "field pfc.priorites: unknown field (did you mean priorities?)" in err
    assert "field ecn.priorities.0" in err


def test_snapshot_errors_use_the_path_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    typed = os.path.relpath(REPO / "examples" / "snapshots")
    assert main(["probe", "--from", typed]) == 2
    assert f"{typed}/meta.json: missing" in one_line(capsys)


@pytest.mark.parametrize("flags", [["--samples", "3"], ["--interval", "2"]])
def test_live_flags_do_not_apply_to_snapshots(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", "--from", str(HEALTHY), *flags]) == 2
    assert f"{flags[0]} does not apply with --from" in one_line(capsys)


def test_snapshot_report_carries_the_capture_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--from", str(HEALTHY), "--output", "json"]) == 0
    assert '"startedAt":"2025-06-12T08:30:00Z"' in capsys.readouterr().out.replace(" ", "")


def test_agent_only_checks_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("peers: {enabled: true}\nstorage: {endpoints: [{name: d, protocol: tcp, "
                   "host: 10.0.0.1, port: 80}]}\n")  # fmt: skip
    main(["probe", "--from", str(HEALTHY), "--config", str(cfg)])
    err = capsys.readouterr().err
    assert "1 storage endpoint(s) and peers (east-west)" in err and "agent only" in err


def test_status_from_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--from", str(EXAMPLE_STATUS)]) == 1  # not Healthy
    out = capsys.readouterr().out
    assert "NetworkValidation roce-pool" in out and "gpu-r3-05" in out
    assert main(["status", "--from", str(EXAMPLE_STATUS), "--nodes"]) == 2
    assert "holds no Node objects" in one_line(capsys)
    nodes = EXAMPLE_STATUS.with_name("roce-pool-nodes.yaml")
    assert main(["status", "--from", str(nodes), "--nodes", "--failing"]) == 1
    out = capsys.readouterr().out
    rows = out[out.index("NODE") :].splitlines()[1:]
    assert [r.split()[0] for r in rows if r.strip()] == ["gpu-r3-05"]
    assert main(["status", "--from", str(nodes), "--watch"]) == 2
    assert "--watch does not apply with --from" in one_line(capsys)


def test_nodes_view_targeted_only_stale_reasons(
    kube: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    nv = "netval.io/v1alpha1"
    kube.create({"apiVersion": nv, "kind": "NetworkValidation", "metadata": {"name": "p"},
                 "spec": {"nodeSelector": {"pool": "gpu"}}})  # fmt: skip
    kube.patch(nv, "networkvalidations", "p", {"status": {"observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "False", "reason": "NodesStale",
         "message": "1 of 2 targeted nodes stale: gpu-b (last report 4m ago)",
         "lastTransitionTime": "2025-01-01T00:00:00Z", "observedGeneration": 1}]}},
        subresource="status")  # fmt: skip
    for name, labels in (("gpu-a", {"pool": "gpu", "netval.io/fabric": "healthy"}),
                         ("gpu-b", {"pool": "gpu", "netval.io/fabric": "unknown"}),
                         ("cpu-x", {})):  # fmt: skip
        kube.create({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": name, "labels": labels}})  # fmt: skip
    main(["status", "p", "--nodes"])
    out = capsys.readouterr().out
    assert "cpu-x" not in out
    row = next(line for line in out.splitlines() if line.strip().startswith("gpu-b"))
    assert "stale (last report 4m ago)" in row
    assert any("labelSelector=pool" in path for _, path in kube.requests())
    main(["status", "p", "--nodes", "--failing"])
    out = capsys.readouterr().out
    assert "gpu-b" in out and "gpu-a" not in out
