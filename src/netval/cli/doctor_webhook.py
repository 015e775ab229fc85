"""`netval doctor`'s webhook check: both configurations exist, and their caBundle is a valid CA
that issued the serving certificate (the operator's mounted Secret) for the Service."""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from netval.cli.doctor_kube import KubeReader
from netval.cli.doctor_result import CheckResult, fail, ok, skip

if TYPE_CHECKING:
    from netval.cli.doctor_operator import OperatorInfo

WEBHOOK_CONFIGURATION: Final = "netval.io"


def check_webhook(kube: KubeReader, ns: str, operator: OperatorInfo | None) -> CheckResult:
    used = operator is not None and operator.webhook
    found: dict[str, dict[str, Any]] = {}
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        code, body = kube.get(
            f"/apis/admissionregistration.k8s.io/v1/{kind}/{WEBHOOK_CONFIGURATION}"
        )
        if code == 200 and isinstance(body, dict):
            found[kind] = body
    if not used and not found:
        return skip("webhook", "the operator serves no admission webhook")
    if len(found) < 2:
        missing = {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"} - set(found)
        return fail("webhook", f"{', '.join(sorted(missing))} {WEBHOOK_CONFIGURATION} missing",
                    "the operator creates them at start: check its logs; or helm upgrade")  # fmt: skip
    problems, seen = [], 0
    serving = _serving_certificate(kube, ns, operator)
    for kind, conf in found.items():
        for hook in conf.get("webhooks") or []:
            seen += 1
            problem = verify_webhook_ca(hook, serving)
            if problem:
                problems.append(f"{kind.split('webhook')[0]} {hook.get('name')}: {problem}")
    if problems:
        return fail("webhook", "; ".join(problems),
                    "re-create the serving certificate from the CA in the configurations "
                    "(helm upgrade), or restart the operator so it rewrites caBundle")  # fmt: skip
    cert_note = (
        "serving certificate issued by it"
        if serving
        else "serving certificate not readable from here"
    )
    return ok("webhook", f"{seen} webhook(s) in {WEBHOOK_CONFIGURATION}: caBundle a valid CA, "
                         f"{cert_note}")  # fmt: skip


def _serving_certificate(kube: KubeReader, ns: str, operator: OperatorInfo | None) -> bytes | None:
    """The webhook's serving certificate (PEM) from the Secret the operator mounts."""
    if operator is None:
        return None
    cert_path = operator.flag("--webhook-cert")
    if not cert_path:
        return None
    directory = str(Path(cert_path).parent)
    volume = operator.volumes.get(directory)
    secret = (volume or {}).get("secret", {}).get("secretName")
    if not secret:
        return None
    code, body = kube.get(f"/api/v1/namespaces/{ns}/secrets/{secret}")
    if code != 200 or not isinstance(body, dict):
        return None
    data = (body.get("data") or {}).get(Path(cert_path).name)
    return base64.b64decode(data) if data else None


def _issued_by(cert: Any, ca: Any) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def verify_webhook_ca(hook: Mapping[str, Any], serving_pem: bytes | None) -> str | None:
    """Why `hook`'s caBundle cannot verify its serving certificate (None: it can)."""
    from cryptography import x509
    from cryptography.x509.oid import ExtensionOID

    bundle = (hook.get("clientConfig") or {}).get("caBundle")
    if not bundle:
        return "no caBundle"
    try:
        cas = x509.load_pem_x509_certificates(base64.b64decode(bundle))
    except ValueError:
        return "caBundle is not base64 PEM certificates"
    now = datetime.datetime.now(datetime.UTC)
    valid = [c for c in cas if c.not_valid_before_utc <= now <= c.not_valid_after_utc]
    if not valid:
        return f"every CA in caBundle has expired or is not yet valid (until {cas[0].not_valid_after_utc:%Y-%m-%d})"
    if serving_pem is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(serving_pem)
    except ValueError:
        return "the serving certificate is not PEM"
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return (
            f"the serving certificate is outside its validity ({cert.not_valid_after_utc:%Y-%m-%d})"
        )
    if not any(_issued_by(cert, ca) for ca in valid):
        return "the serving certificate is not issued by a CA in caBundle"
    service = (hook.get("clientConfig") or {}).get("service")
    if service:
        host = f"{service.get('name')}.{service.get('namespace')}.svc"
        try:
            san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
            names = cast(x509.SubjectAlternativeName, san.value).get_values_for_type(x509.DNSName)
        except x509.ExtensionNotFound:
            names = []
        if host not in names:
            return (
                f"the serving certificate is not for {host} (it names {', '.join(names) or 'none'})"
            )
    return None
