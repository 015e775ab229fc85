"""MQTT connection pieces shared by agent and operator: the client as both build it, and the
reconnect delay (capped exponential backoff with full jitter)."""

from __future__ import annotations

import random
import ssl

import aiomqtt
from aiomqtt import ProtocolVersion, Will

from netval.infra.mqtt_settings import MqttSettings


def make_client(
    settings: MqttSettings,
    *,
    keepalive: int,
    timeout: float = 10.0,
    will: Will | None = None,
    tls_context: ssl.SSLContext | None = None,
) -> aiomqtt.Client:
    """An MQTT v5 client for `settings` (must be called with an event loop running)."""
    return aiomqtt.Client(
        settings.host,
        settings.port,
        username=settings.username,
        password=settings.password,
        identifier=settings.client_id,
        protocol=ProtocolVersion.V5,
        will=will,
        keepalive=keepalive,
        timeout=timeout,
        tls_context=tls_context,
    )


def backoff_delay(failures: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(failures-1))], so a fleet of agents that
    lost the broker together does not come back together."""
    ceiling = min(cap, base * 2 ** min(max(failures, 1) - 1, 30))
    return rng.uniform(0, ceiling)
