"""Which failed MQTT connects mean "the broker refuses this credential". Pure: no I/O.

Only a CONNACK that says so: MQTT v5 reason codes 0x86 (bad user name or password) and
0x87 (not authorized), MQTT 3.1.1 return codes 4 and 5. Everything else (DNS, TCP refused,
TLS, a timeout, a broker that is restarting, "server unavailable") says nothing about the
credential, and enrolling again then would only rotate a credential that still works
(docs/operations.md, "Per-node MQTT identity").
"""

from __future__ import annotations

from typing import Final

from aiomqtt.exceptions import MqttConnectError

V5_REFUSALS: Final = frozenset({0x86, 0x87})
V3_REFUSALS: Final = frozenset({4, 5})


def credential_refused(exc: BaseException) -> bool:
    """True when `exc` is a CONNACK refusing the user name/password or the client."""
    if not isinstance(exc, MqttConnectError):
        return False
    rc = exc.rc
    if isinstance(rc, int):  # MQTT 3.1.1: a bare return code
        return rc in V3_REFUSALS
    value = getattr(rc, "value", None)  # MQTT v5: paho's ReasonCode
    return isinstance(value, int) and value in V5_REFUSALS
