"""The `netval-snapshot/1` directory format: record a live host, load a recorded one.

Recording copies sysfs files byte for byte as read (a failed read leaves the file absent)
and adds the ethtool and DCB data the live collector fetched. Loading parses the copy with
the live collector's own sysfs parser, so both give the same typed snapshot.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from netval.agent.checks.drivers import all_hw_counter_names, hw_counter_names_for
from netval.agent.checks.infiniband import port_counter_names
from netval.agent.collect.sysfs import (
    DEVICE_FILES,
    NETDEV_FILES,
    PORT_FILES,
    PRIORITIES,
    SnapshotDataError,
    SysfsReader,
)
from netval.model.snapshot import (
    SNAPSHOT_FORMAT,
    SNAPSHOT_MAJOR,
    Dcb,
    DcbApp,
    NodeSnapshot,
    Sample,
)

META_FILE: Final = "meta.json"
MIN_SAMPLES: Final = 2
# dcb/<if>.error: why DCB netlink gave nothing (an errno name or a short reason).
DCB_ERROR_MAX: Final = 64
_MINOR = re.compile(r"^\.[0-9]{1,4}$")


def _readable_format(fmt: object) -> bool:
    """1.0 ("netval-snapshot/1") and every 1.x: minors only add files."""
    if not isinstance(fmt, str) or not fmt.startswith(SNAPSHOT_MAJOR):
        return False
    rest = fmt[len(SNAPSHOT_MAJOR) :]
    return rest == "" or _MINOR.match(rest) is not None


class SnapshotError(ValueError):
    """A snapshot directory that cannot be evaluated; the message names file and field."""


class _Meta(BaseModel):
    # Unknown keys are tolerated: newer minor writers may add information; the format
    # string is what versions the layout.
    model_config = ConfigDict(extra="ignore")

    format: str
    node: Annotated[str, Field(min_length=1, max_length=253)]
    captured_at: Annotated[str, Field(min_length=1)]
    interval_seconds: Annotated[float, Field(gt=0)]


class _DcbAppFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    selector: Annotated[str, Field(min_length=1, max_length=16)]
    protocol: Annotated[int, Field(ge=0, le=65535)]
    priority: Annotated[int, Field(ge=0, le=7)]


class _DcbFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pfc_enabled: list[Annotated[int, Field(ge=0, le=7)]]
    pfc_requests: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=8)] = []
    pfc_indications: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=8)] = []
    app: list[_DcbAppFile] = []


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field {where}: {err['msg']}{more}"


def _read_json(path: Path, root: Path) -> Any:
    rel = path.relative_to(root.parent) if path.is_relative_to(root.parent) else path
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SnapshotError(f"{rel}: missing") from None
    except OSError as exc:
        raise SnapshotError(f"{rel}: cannot read: {exc.strerror}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SnapshotError(f"{rel}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{rel}: invalid JSON: {exc.msg} at line {exc.lineno}") from None


def load_snapshot(directory: Path) -> NodeSnapshot:
    """Parse a recorded snapshot; SnapshotError (one line, naming file and field) if bad."""
    if not directory.is_dir():
        raise SnapshotError(f"{directory}: not a directory")
    meta_raw = _read_json(directory / META_FILE, directory)
    if not isinstance(meta_raw, dict):
        raise SnapshotError(f"{directory.name}/{META_FILE}: expected a JSON object")
    fmt = meta_raw.get("format")
    if not _readable_format(fmt):
        raise SnapshotError(
            f"{directory.name}/{META_FILE}: field format: unsupported {fmt!r} "
            f"(this netval reads {SNAPSHOT_MAJOR!r} and {SNAPSHOT_MAJOR}.x up to "
            f"{SNAPSHOT_FORMAT!r})"
        )
    try:
        meta = _Meta.model_validate(meta_raw)
    except ValidationError as exc:
        raise SnapshotError(f"{directory.name}/{META_FILE}: {_first_error(exc)}") from None
    samples_dir = directory / "samples"
    names = sorted((n for n in _listdir(samples_dir) if n.isdigit()), key=int)
    if len(names) < MIN_SAMPLES:
        raise SnapshotError(
            f"{directory.name}/samples: {len(names)} sample(s), the format needs at least "
            f"{MIN_SAMPLES} (samples/0, samples/1, ...)"
        )
    samples = tuple(_load_sample(directory, samples_dir / n) for n in names)
    return NodeSnapshot(
        node=meta.node,
        captured_at=meta.captured_at,
        interval_seconds=meta.interval_seconds,
        samples=samples,
    )


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _load_sample(root: Path, sample_dir: Path) -> Sample:
    reader = SysfsReader(
        sample_dir / "sys",
        rdma_cm_root=sample_dir / "rdma_cm",
        strict=True,
        hw_counter_names=all_hw_counter_names(),
        port_counter_names=port_counter_names(),
        hw_counter_names_for=hw_counter_names_for,
    )
    try:
        rdma = {name: reader.read_rdma_device(name) for name in reader.rdma_device_names()}
        netdevs = {}
        for name in _listdir(reader.net_root):
            netdev = reader.read_netdev(
                name,
                ethtool=_load_ethtool(root, sample_dir / "ethtool" / f"{name}.json"),
                dcb=_load_dcb(root, sample_dir / "dcb" / f"{name}.json"),
                dcb_error=_load_dcb_error(root, sample_dir / "dcb" / f"{name}.error"),
            )
            if netdev is not None:
                netdevs[name] = netdev
    except SnapshotDataError as exc:
        raise SnapshotError(f"{exc.path.relative_to(root.parent)}: {exc.problem}") from None
    return Sample(netdevs=netdevs, rdma=rdma)


def _load_ethtool(root: Path, path: Path) -> dict[str, int] | None:
    if not path.exists():
        return None
    data = _read_json(path, root)
    rel = path.relative_to(root.parent)
    if not isinstance(data, dict):
        raise SnapshotError(f"{rel}: expected a JSON object of statistic name to integer")
    out: dict[str, int] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SnapshotError(
                f"{rel}: field {key}: expected a non-negative integer, got {value!r}"
            )
        out[key] = value
    return out


def _load_dcb_error(root: Path, path: Path) -> str | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotError(
            f"{path.relative_to(root.parent)}: cannot read: {exc.strerror}"
        ) from None
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise SnapshotError(f"{path.relative_to(root.parent)}: not ASCII text") from None
    if not text or len(text) > DCB_ERROR_MAX or not text.isprintable():
        raise SnapshotError(
            f"{path.relative_to(root.parent)}: expected one short line (an errno name such as "
            f"EOPNOTSUPP), got {text[:40]!r}"
        )
    return text


def _load_dcb(root: Path, path: Path) -> Dcb | None:
    if not path.exists():
        return None
    data = _read_json(path, root)
    try:
        parsed = _DcbFile.model_validate(data)
    except ValidationError as exc:
        raise SnapshotError(f"{path.relative_to(root.parent)}: {_first_error(exc)}") from None
    return Dcb(
        pfc_enabled=frozenset(parsed.pfc_enabled),
        pfc_requests=tuple(parsed.pfc_requests),
        pfc_indications=tuple(parsed.pfc_indications),
        app=tuple(DcbApp(a.selector, a.protocol, a.priority) for a in parsed.app),
    )


# -- recording ------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> None:
    """Copy one sysfs file as read; a read that fails leaves it absent, as the format says."""
    try:
        with open(src, "rb") as fh:
            data = fh.read()
    except OSError:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)


def _copy_dir_files(src: Path, dst: Path) -> None:
    for name in _listdir(src):
        if (src / name).is_file():
            _copy(src / name, dst / name)


def record_sample(
    sample_dir: Path,
    sample: Sample,
    *,
    sys_root: Path,
    rdma_cm_root: Path | None,
) -> None:
    """Write one sample: sysfs copies for its netdevs and RDMA devices, ethtool, DCB."""
    net_src = sys_root / "class" / "net"
    net_dst = sample_dir / "sys" / "class" / "net"
    for name, netdev in sample.netdevs.items():
        (net_dst / name).mkdir(parents=True, exist_ok=True)
        for rel in NETDEV_FILES:
            _copy(net_src / name / rel, net_dst / name / rel)
        for role in ("roce_np", "roce_rp"):
            for prio in PRIORITIES:
                rel = f"ecn/{role}/enable/{prio}"
                _copy(net_src / name / rel, net_dst / name / rel)
        if netdev.ethtool is not None:
            _write_json(sample_dir / "ethtool" / f"{name}.json", netdev.ethtool)
        if netdev.dcb is not None:
            _write_json(sample_dir / "dcb" / f"{name}.json", dcb_to_json(netdev.dcb))
        elif netdev.dcb_error:
            path = sample_dir / "dcb" / f"{name}.error"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                netdev.dcb_error[:DCB_ERROR_MAX] + "\n", encoding="ascii", errors="replace"
            )
        for lower in netdev.lower:
            (net_dst / name / f"lower_{lower}").mkdir(parents=True, exist_ok=True)
    drivers = {n.driver for n in sample.netdevs.values()}
    drivers.update(d.driver for d in sample.rdma.values())
    for driver in sorted(d for d in drivers if d and "/" not in d):
        rel = f"module/{driver}/version"  # issue 22: absent for most in-tree drivers
        _copy(sys_root / rel, sample_dir / "sys" / rel)
    ib_src = sys_root / "class" / "infiniband"
    ib_dst = sample_dir / "sys" / "class" / "infiniband"
    for name, device in sample.rdma.items():
        for rel in DEVICE_FILES:
            _copy(ib_src / name / rel, ib_dst / name / rel)
        if device.netdev_hint:
            (ib_dst / name / "device" / "net" / device.netdev_hint).mkdir(
                parents=True, exist_ok=True
            )
        for netdev_name in device.pci_netdevs:  # each port binds to its dev_port's netdev
            rel = f"device/net/{netdev_name}/dev_port"
            (ib_dst / name / "device" / "net" / netdev_name).mkdir(parents=True, exist_ok=True)
            _copy(ib_src / name / rel, ib_dst / name / rel)
        for port in device.ports:
            src = ib_src / name / "ports" / str(port)
            dst = ib_dst / name / "ports" / str(port)
            dst.mkdir(parents=True, exist_ok=True)
            for rel in PORT_FILES:
                _copy(src / rel, dst / rel)
            for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs", "counters", "hw_counters"):
                _copy_dir_files(src / sub, dst / sub)
            if rdma_cm_root is not None:
                rel = f"{name}/ports/{port}/default_roce_tos"
                _copy(rdma_cm_root / rel, sample_dir / "rdma_cm" / rel)


def dcb_to_json(dcb: Dcb) -> dict[str, Any]:
    return {
        "pfc_enabled": sorted(dcb.pfc_enabled),
        "pfc_requests": list(dcb.pfc_requests),
        "pfc_indications": list(dcb.pfc_indications),
        "app": [
            {"selector": a.selector, "protocol": a.protocol, "priority": a.priority}
            for a in dcb.app
        ],
    }


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def write_meta(directory: Path, *, node: str, captured_at: str, interval_seconds: float) -> None:
    _write_json(
        directory / META_FILE,
        {
            "format": SNAPSHOT_FORMAT,
            "node": node,
            "captured_at": captured_at,
            "interval_seconds": interval_seconds,
        },
    )


def prepare_output_dir(directory: Path) -> None:
    """An output directory must be new or empty: never mix two captures."""
    if directory.exists():
        if not directory.is_dir():
            raise SnapshotError(f"{directory}: exists and is not a directory")
        if any(directory.iterdir()):
            raise SnapshotError(f"{directory}: not empty (choose a new directory)")
    directory.mkdir(parents=True, exist_ok=True)


def hardware_netdevs(sys_root: Path) -> list[str]:
    """Netdevs backed by a device (NICs, not veths or bridges): worth recording."""
    net = sys_root / "class" / "net"
    return [n for n in _listdir(net) if (net / n / "device").exists()]
