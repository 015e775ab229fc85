"""The HTTPS server of the admission webhooks: Kopf's `WebhookServer` answering with
`Reviewer`, each client config it yields written to the configurations."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, cast

import kopf

from netval.infra.task_stop import cancel_and_wait
from netval.operator.admission.configurations import ConfigurationWriter, client_config
from netval.operator.admission.options import WebhookOptions
from netval.operator.admission.reviewer import Reviewer
from netval.operator.kube import certs as webhook_certs

log = logging.getLogger("netval.operator.admission")

SERVICE_MEMO_KEY: Final = "webhook_service"
# memo: a WebhookService the process serves on every replica; a term only turns its
# configuration writing on and off (netval.operator.process)
SHARED_SERVICE_MEMO_KEY: Final = "webhook_shared_service"


class WebhookService:
    """Kopf's HTTPS `WebhookServer` answering with `Reviewer`, and the configurations.

    Without a certificate and key, a self-signed CA and certificate are generated
    (`webhook_certs`). Kopf's server reloads renewed certificate files and yields a new client
    config each time; each is written to both webhook configurations. A server that fails
    (e.g. the port is taken) is logged and started again."""

    def __init__(
        self, options: WebhookOptions, reviewer: Reviewer, excluded_namespaces: Iterable[str]
    ) -> None:
        self.options = options
        self.reviewer = reviewer
        self.writer = ConfigurationWriter(options, excluded_namespaces)
        self.cert_files: webhook_certs.CertFiles | None = None
        self.client_config: dict[str, Any] | None = None
        self.writes_configurations = True  # only the leader writes them
        self._task: asyncio.Task[None] | None = None

    def write_configurations(self) -> None:
        """From now on write the configurations (this replica leads): the current client
        config at once, later ones as the server yields them."""
        self.writes_configurations = True
        if self.client_config is not None:
            self.writer.submit(self.client_config)

    async def stop_writing(self) -> None:
        """Stop writing configurations (leadership ended); reviews are still answered."""
        self.writes_configurations = False
        await self.writer.stop()

    def certificates(self) -> webhook_certs.CertFiles:
        o = self.options
        if o.cert_file is not None and o.key_file is not None:
            return webhook_certs.CertFiles(ca=o.ca_file or o.cert_file, cert=o.cert_file,
                                           key=o.key_file)  # fmt: skip
        if self.cert_files is None:
            directory = o.cert_dir or Path(tempfile.mkdtemp(prefix="netval-webhook-"))
            extra = (
                webhook_certs.service_dns_names(o.service.namespace, o.service.name)
                if o.service is not None
                else []
            )
            self.cert_files = webhook_certs.generate_self_signed(
                directory, webhook_certs.server_sans(o.host, extra)
            )
            log.info("generated a self-signed webhook certificate in %s", directory)
        return self.cert_files

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="netval-webhook")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        await self.writer.stop()

    async def run(self) -> None:
        while True:
            try:
                await self.serve()
            except Exception:
                log.exception("the admission webhook server failed; restarting in 5s")
            await asyncio.sleep(5)

    async def serve(self) -> None:
        files = self.certificates()
        o = self.options
        server = kopf.WebhookServer(
            addr=o.host,
            port=o.port or None,
            host=None if _is_unspecified(o.host) else o.host,
            certfile=files.cert,
            pkeyfile=files.key,
            cafile=files.ca,
        )
        async with server:
            async for base in server(cast(kopf.WebhookFn, self.reviewer)):
                self.client_config = client_config(base, o.service)
                log.info("serving admission webhooks at %s", base.get("url"))
                if self.writes_configurations:
                    self.writer.submit(self.client_config)


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
