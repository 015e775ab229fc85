"""Static checks of the Dockerfile (no Docker engine here): a pinned base, multi-stage with only
the virtualenv carried over, a non-root final user that matches the chart and the agent
DaemonSet, `netval` as the entrypoint, no remote ADD, no secrets in the image."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from netval.operator.agents import manifests

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
FULL_VERSION_TAG = re.compile(r":\d+\.\d+\.\d+[-.\w]*$")
SECRET_WORDS = re.compile(r"PASSW(OR)?D|TOKEN|SECRET|API_?KEY|PRIVATE_?KEY|CREDENTIAL", re.I)


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (Dockerfile syntax)."""
    instructions: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are skipped
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        pending += stripped
        keyword, _, args = pending.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            result.append([])
        assert result, f"line {ins.line}: {ins.keyword} before the first FROM"
        result[-1].append(ins)
    return result


def from_image(ins: Instruction) -> str:
    words = [w for w in ins.args.split() if not w.startswith("--")]
    return words[0]


def test_parser_joins_continuations_and_skips_comments() -> None:
    parsed = parse("# c\nFROM a AS b\nRUN x \\\n  # inner\n  && y\nUSER 1\n")
    assert [(i.keyword, i.args) for i in parsed] == [
        ("FROM", "a AS b"),
        ("RUN", "x && y"),
        ("USER", "1"),
    ]


def test_multi_stage(instructions: list[Instruction]) -> None:
    all_stages = stages(instructions)
    assert len(all_stages) >= 2
    final = all_stages[-1]
    copies = [i for i in final if i.keyword == "COPY"]
    assert any(i.args.startswith("--from=") and "/opt/netval" in i.args for i in copies)
    # Nothing is built in the final stage: it receives the virtualenv, and installs only the
    # load-test engines from Debian (their package lists removed in the same layer).
    for ins in final:
        if ins.keyword == "RUN":
            assert not re.search(r"\bpip\b|\bcurl\b|\bwget\b", ins.args), ins
            if "apt-get" in ins.args:
                packages = shlex.split(ins.args.split("--no-install-recommends", 1)[1])
                assert packages[:2] == ["iperf3", "perftest"], ins
                assert "rm -rf /var/lib/apt/lists/*" in ins.args, ins
        if ins.keyword == "COPY":
            assert ins.args.startswith("--from="), (
                f"line {ins.line}: the final stage copies only from the builder"
            )


def test_every_base_image_is_pinned(instructions: list[Instruction]) -> None:
    names = set()
    for ins in instructions:
        if ins.keyword != "FROM":
            continue
        image = from_image(ins)
        if image in names:
            continue  # a previous stage
        assert "$" not in image, f"line {ins.line}: the base comes from a build argument"
        assert not image.endswith(":latest")
        assert DIGEST.search(image) or FULL_VERSION_TAG.search(image), (
            f"line {ins.line}: {image} is pinned neither by digest nor by a full version tag"
        )
        words = ins.args.split()
        if "AS" in (w.upper() for w in words):
            names.add(words[-1])


def test_final_user_is_non_root_and_matches_the_pods(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    users = [i for i in final if i.keyword == "USER"]
    assert users, "the final stage sets no USER: the image would run as root"
    user = users[-1].args
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root uid (runAsNonRoot can check it)"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # The chart's operator and the operator's agent DaemonSet run as this uid too.
    assert int(uid) == manifests.AGENT_UID == 65532


def test_the_agent_capability_interpreter_is_made_in_the_final_stage(
    instructions: list[Instruction],
) -> None:
    from netval.operator.agents.agent_pod import NET_RAW_INTERPRETER

    runs = [i.args for i in stages(instructions)[-1] if i.keyword == "RUN"]
    made = [r for r in runs if NET_RAW_INTERPRETER in r]
    assert len(made) == 1, "the interpreter the lldp agents run"
    assert f"-m netval.infra.file_caps {NET_RAW_INTERPRETER}" in made[0]
    # The venv's own interpreter (operator, CLI) gets no capability.
    assert "file_caps /opt/netval/bin/python " not in made[0] + " "
    users = [i for i in stages(instructions)[-1] if i.keyword in {"RUN", "USER"}]
    assert users[-1].keyword == "USER", "made as root, before the final USER"


def test_entrypoint_is_netval(instructions: list[Instruction]) -> None:
    entrypoints = [i for i in stages(instructions)[-1] if i.keyword == "ENTRYPOINT"]
    assert entrypoints
    assert json.loads(entrypoints[-1].args) == ["netval"], "exec form, so signals reach netval"


def test_no_remote_add(instructions: list[Instruction]) -> None:
    for ins in instructions:
        if ins.keyword == "ADD":
            assert not re.search(r"(https?|git|ftp)://|git@", ins.args), f"line {ins.line}"


def test_no_secrets_in_the_image(instructions: list[Instruction]) -> None:
    for ins in instructions:
        if ins.keyword in {"ENV", "ARG", "LABEL"}:
            for word in shlex.split(ins.args):
                name = word.partition("=")[0]
                assert not SECRET_WORDS.search(name), f"line {ins.line}: {name}"
        if ins.keyword in {"COPY", "ADD"}:
            assert not re.search(
                r"\.env\b|id_rsa|\.pem\b|\.key\b|kubeconfig|\.netrc", ins.args, re.I
            ), ins
        if ins.keyword == "RUN":
            assert not re.search(r"(PASSW(OR)?D|TOKEN|SECRET)=\S", ins.args, re.I), ins


def test_no_healthcheck_kubernetes_probes_instead(instructions: list[Instruction]) -> None:
    assert not [i for i in instructions if i.keyword == "HEALTHCHECK"]


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # Everything excluded, then only what the build copies allowed back in.
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "src"}
    copied = {
        part.rstrip("/")
        for ins in parse(DOCKERFILE.read_text())
        if ins.keyword == "COPY" and not ins.args.startswith("--from=")
        for part in ins.args.split()[:-1]
    }
    assert copied <= allowed, copied - allowed


def test_the_load_test_engines_are_debian_s_and_only_the_rdma_copies_hold_ipc_lock(
    instructions: list[Instruction],
) -> None:
    from netval.operator.agents.agent_pod import ENGINE_PATH, RDMA_ENGINE_DIR

    runs = [i.args for i in stages(instructions)[-1] if i.keyword == "RUN"]
    installs = [r for r in runs if "apt-get install" in r]
    assert len(installs) == 1 and {"iperf3", "perftest"} <= set(shlex.split(installs[0]))
    caps = [r for r in runs if "--cap ipc_lock" in r]
    assert len(caps) == 1 and f"{RDMA_ENGINE_DIR}/$engine" in caps[0]
    for engine in ("ib_write_bw", "ib_write_lat"):
        assert engine in caps[0]
    # the agent finds them first only on the engine path of RDMA load tests' pods
    assert ENGINE_PATH.split(":")[0] == RDMA_ENGINE_DIR
    ci = (ROOT / ".ci" / "run").read_text()
    assert "iperf3 perftest" in ci  # CI installs the same engines
