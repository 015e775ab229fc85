"""`netval probe` and `netval snapshot`: the node checks on this host or a recorded snapshot."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from netval.cli.common import (
    EXIT_OK,
    EXIT_UNHEALTHY,
    BadInput,
    load_probe_config,
    node_name,
)
from netval.cli.parser import DEFAULT_PROBE_INTERVAL, DEFAULT_SAMPLES, DEFAULT_SNAPSHOT_INTERVAL
from netval.model.spec import Checks


def _as_typed(message: str, source: Path) -> str:
    """A snapshot error names files relative to the snapshot's parent (`healthy-roce/meta.json`);
    say it with the path as the user typed it (`examples/snapshots/healthy-roce/meta.json`)."""
    name = source.name
    if name and message.startswith(f"{name}/") and str(source) != name:
        return f"{source}/{message[len(name) + 1 :]}"
    return message


def _captured_at(text: str) -> datetime:
    """meta.json's captured_at (ISO 8601, validated by the loader) as an aware datetime."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.now(UTC)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _agent_only_note(checks: Checks) -> str | None:
    """What `netval probe` does not probe (the agent does): storage endpoints, peers."""
    parts = []
    if checks.storage.endpoints:
        parts.append(f"{len(checks.storage.endpoints)} storage endpoint(s)")
    if checks.peers.enabled:
        parts.append("peers (east-west)")
    if not parts:
        return None
    return (
        f"netval probe: note: {' and '.join(parts)} in the config are probed by the agent "
        "only (netval agent, on a cluster); not judged here\n"
    )


def cmd_probe(args: argparse.Namespace) -> int:
    from netval.agent.collect.snapshot_dir import SnapshotError, load_snapshot
    from netval.agent.report import build_report
    from netval.cli.table import render_table, use_colour

    config = load_probe_config(args.config)
    t0 = time.perf_counter()
    if args.source is not None:
        given = [f for f, v in (("--samples", args.samples), ("--interval", args.interval)) if v]
        if given:
            verb = "does" if len(given) == 1 else "do"
            raise BadInput(
                f"{' and '.join(given)} {verb} not apply with --from: a snapshot holds its "
                "own samples and interval"
            )
        try:
            snapshot = load_snapshot(args.source)
        except SnapshotError as exc:
            raise BadInput(_as_typed(str(exc), args.source)) from None
        started_at = _captured_at(snapshot.captured_at)  # the capture's time, not now
    else:
        from netval.agent.collect.live import LiveCollector, collect

        started_at = datetime.now(UTC)
        with LiveCollector(interfaces=config.checks.named_interfaces) as collector:
            snapshot = collect(
                collector,
                node=node_name(args.node),
                samples=args.samples or DEFAULT_SAMPLES,
                interval=DEFAULT_PROBE_INTERVAL if args.interval is None else args.interval,
            )
    note = _agent_only_note(config.checks)
    if note:
        sys.stderr.write(note)
    report = build_report(
        snapshot,
        config.checks,
        validation=config.validation,
        generation=0,
        started_at=started_at,
        duration_ms=(time.perf_counter() - t0) * 1000,
        # uname(2) of this host; a recorded snapshot's kernel is not this one's
        kernel_release=os.uname().release if args.source is None else None,
    )
    if args.output == "json":
        sys.stdout.write(report.to_json() + "\n")
    else:
        sys.stdout.write(render_table(report, colour=use_colour(sys.stdout), verbose=args.verbose))
    return EXIT_UNHEALTHY if report.status.is_bad else EXIT_OK


def _cannot_write(path: Path, exc: OSError) -> BadInput:
    where = exc.filename if isinstance(exc.filename, str) else path
    return BadInput(f"--out {path}: cannot write {where}: {exc.strerror or exc}")


def cmd_snapshot(args: argparse.Namespace) -> int:
    from netval.agent.collect.live import (
        DEFAULT_RDMA_CM_ROOT,
        DEFAULT_SYS_ROOT,
        LiveCollector,
        collect,
    )
    from netval.agent.collect.snapshot_dir import (
        MIN_SAMPLES,
        SnapshotError,
        hardware_netdevs,
        prepare_output_dir,
        record_sample,
        write_meta,
    )
    from netval.model.snapshot import Sample

    samples = args.samples or DEFAULT_SAMPLES
    interval = DEFAULT_SNAPSHOT_INTERVAL if args.interval is None else args.interval
    if samples < MIN_SAMPLES:
        raise BadInput(f"--samples: a snapshot needs at least {MIN_SAMPLES} samples")
    config = load_probe_config(args.config)
    out: Path = args.out
    try:
        prepare_output_dir(out)
    except SnapshotError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:  # under /proc, under a file, a read-only mount, no permission
        raise _cannot_write(out, exc) from None
    interfaces = [*config.checks.named_interfaces, *hardware_netdevs(DEFAULT_SYS_ROOT)]

    def record(i: int, sample: Sample) -> None:
        record_sample(
            out / "samples" / str(i),
            sample,
            sys_root=DEFAULT_SYS_ROOT,
            rdma_cm_root=DEFAULT_RDMA_CM_ROOT,
        )

    try:
        with LiveCollector(interfaces=list(dict.fromkeys(interfaces))) as collector:
            snapshot = collect(
                collector,
                node=node_name(args.node),
                samples=samples,
                interval=interval,
                on_sample=record,
            )
        write_meta(
            out,
            node=snapshot.node,
            captured_at=snapshot.captured_at,
            # a window too short to measure still has a length: the format needs > 0
            interval_seconds=max(snapshot.interval_seconds, 0.001),
        )
    except OSError as exc:
        raise _cannot_write(out, exc) from None
    sys.stderr.write(f"recorded {samples} samples in {out}\n")
    return EXIT_OK
