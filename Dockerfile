# syntax=docker/dockerfile:1
#
# netval: one image for `netval operator` (the Deployment) and `netval agent` (the DaemonSets
# the operator renders), plus the CLI (`netval probe`, `netval snapshot`, ...).
#
#   docker build -t ghcr.io/netval/netval:0.1.0 .
#   docker run --rm ghcr.io/netval/netval:0.1.0 --version
#
# Two stages: the builder makes a virtualenv with `pip install .`; the runtime stage is the same
# slim Python base with only that virtualenv copied in (no pip cache, no build tree, no
# compiler). Both stages use the same base, pinned by digest (python:3.11-slim-bookworm), so the
# virtualenv's interpreter link (/usr/local/bin/python3.11) exists in the runtime stage. Bump
# the digest deliberately (and rebuild) to take Debian security updates.
#
# Runs as uid/gid 65532 ("nonroot"), which is also what the chart and the agent DaemonSet set
# (runAsUser 65532, readOnlyRootFilesystem). Nothing needs root: the agent's reads (sysfs, the
# ethtool stats ioctl, DCB netlink GET) are unprivileged; LLDP frames need CAP_NET_RAW, which
# only the capability interpreter below has; perftest's memory registration needs
# CAP_IPC_LOCK, which only the perftest copies under /opt/netval/rdma-bin have. The load-test
# engines come from Debian: iperf3 and perftest (docs/loadtest.md, "Engines"). No secrets at build time or in the
# image: MQTT credentials arrive as mounted files at run time (NETVAL_MQTT_PASSWORD_FILE).
# No HEALTHCHECK: Kubernetes probes the operator (--liveness) and the agent (/healthz).

FROM python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91 AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/netval

WORKDIR /src
# Only what the build needs (see .dockerignore): metadata first, then the package.
COPY pyproject.toml README.md ./
COPY src ./src
# Byte-compiles while installing: the runtime root filesystem is read-only, so .pyc files
# could not be written later.
RUN /opt/netval/bin/pip install . \
 && /opt/netval/bin/netval --version


FROM python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91 AS runtime

LABEL org.opencontainers.image.title="netval" \
      org.opencontainers.image.description="Continuous validation of the network fabric of GPU clusters on Kubernetes" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

# The load-test engines (docs/loadtest.md, "Engines"): iperf3 for TCP, perftest (with its
# libibverbs and rdma-core providers) for RoCE and InfiniBand. iperf3's debconf question
# (run a system daemon?) keeps its default, no.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iperf3 perftest \
 && rm -rf /var/lib/apt/lists/*

# A named account for uid 65532, so tools that look the user up (getpass, ~) find one.
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin nonroot

COPY --from=builder /opt/netval /opt/netval

# The agent's capability interpreter (spec.topology.lldp; docs/topology.md "Privileges"): a
# copy of the interpreter with the file capability cap_net_raw+ep, so the non-root agent can
# open its AF_PACKET socket for LLDP frames. Kubernetes' `capabilities.add` alone only fills
# the bounding set. Only the agent DaemonSet of a validation with lldp runs it (with NET_RAW
# in its bounding set); the venv's own interpreter, which runs the operator and the CLI, has
# no capability. Set here, not in the builder: COPY does not reliably carry xattrs.
RUN cp "$(readlink -f /opt/netval/bin/python)" /opt/netval/bin/python-netraw \
 && /opt/netval/bin/python -m netval.infra.file_caps /opt/netval/bin/python-netraw

# perftest for RDMA load tests (docs/loadtest.md, "Privileges"): copies of its binaries
# with cap_ipc_lock+ep (memory registration pins buffers beyond RLIMIT_MEMLOCK). Only the
# agents of validations with RDMA load tests look here first (NETVAL_ENGINE_PATH) and have
# IPC_LOCK in their bounding set; /usr/bin's copies have no capability.
RUN mkdir -p /opt/netval/rdma-bin \
 && for engine in ib_write_bw ib_write_lat ib_send_lat; do \
      cp /usr/bin/$engine /opt/netval/rdma-bin/$engine \
      && /opt/netval/bin/python -m netval.infra.file_caps --cap ipc_lock /opt/netval/rdma-bin/$engine; \
    done

ENV PATH="/opt/netval/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

USER 65532:65532
ENTRYPOINT ["netval"]
CMD ["--help"]
