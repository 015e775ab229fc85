"""`netval agent` and `netval operator`: the long-running processes.

Configuration they cannot start without is checked here, before anything starts: one line on
stderr and exit 2, never a traceback and a retry loop."""

from __future__ import annotations

import argparse
import os

from netval.cli.common import ENV_LOG_LEVEL, EXIT_OK, BadInput, load_kube_config


def setup_logging() -> None:
    """Long-running processes (agent, operator) log to stderr; NETVAL_LOG_LEVEL sets the level."""
    import logging

    level = os.environ.get(ENV_LOG_LEVEL, "INFO").strip().upper() or "INFO"
    if not isinstance(logging.getLevelName(level), int):
        raise BadInput(f"{ENV_LOG_LEVEL}: not a log level: {level!r} (DEBUG, INFO, WARNING, ERROR)")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from netval.infra.log_redaction import install_log_redaction

    install_log_redaction()


def cmd_agent(args: argparse.Namespace) -> int:
    import asyncio

    from netval.agent.config import AgentConfigError, agent_settings_from_env
    from netval.agent.enroll import enroll_settings_from_env
    from netval.agent.main import run_agent

    setup_logging()
    try:
        settings = agent_settings_from_env(os.environ)
        # checked before it starts
        enroll_settings_from_env(os.environ, settings.node, settings.config.validation)
    except (AgentConfigError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    asyncio.run(run_agent(settings))
    return EXIT_OK


def cmd_operator(args: argparse.Namespace) -> int:
    import asyncio

    from netval.infra.metrics_server import parse_host_port
    from netval.operator.admission.options import webhook_options
    from netval.operator.identity.service import identity_settings_from_env
    from netval.operator.leadership.settings import ElectionConfigError, election_settings_from_env
    from netval.operator.process import OperatorStartError, parse_liveness_url, run_operator
    from netval.operator.settings import OperatorConfigError, operator_settings_from_env

    setup_logging()
    try:
        settings = operator_settings_from_env(os.environ)
        if identity_settings_from_env(os.environ) is not None and settings.identity_ca is None:
            raise OperatorConfigError(
                "NETVAL_ENROLL_ADDR needs the identity CA (NETVAL_IDENTITY_CA_FILE and "
                "NETVAL_IDENTITY_CA_KEY_FILE): it signs the agents' certificates"
            )
    except OperatorConfigError as exc:
        raise BadInput(str(exc)) from None
    try:
        election = None if args.standalone else election_settings_from_env(settings.namespace)
    except ElectionConfigError as exc:
        raise BadInput(str(exc)) from None
    try:
        if args.liveness is not None:
            parse_liveness_url(args.liveness)
        metrics_addr = parse_host_port(args.metrics_addr, variable="--metrics-addr")
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    try:
        webhook = webhook_options(
            args.webhook_addr,
            cert=args.webhook_cert,
            key=args.webhook_key,
            ca=args.webhook_ca,
            service=args.webhook_service,
            failure_policy=args.webhook_failure_policy,
            timeout_seconds=args.webhook_timeout,
        )
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    # Kopf would log a traceback and retry its login every 60 s without one: check it first.
    load_kube_config()
    try:
        asyncio.run(
            run_operator(
                settings,
                standalone=args.standalone,
                liveness_endpoint=args.liveness,
                metrics_addr=metrics_addr,
                webhook=webhook,
                election=election,
            )
        )
    except OperatorStartError as exc:
        raise BadInput(str(exc)) from None
    return EXIT_OK


def cmd_uninstall_cleanup(args: argparse.Namespace) -> int:
    from netval.operator.uninstall import CleanupOptions, parse_namespaced_name, run_command

    try:
        deployment = (
            parse_namespaced_name(args.operator_deployment) if args.operator_deployment else None
        )
    except ValueError as exc:
        raise BadInput(f"--operator-deployment: {exc}") from None
    return run_command(
        CleanupOptions(
            operator_deployment=deployment,
            agent_namespace=args.agent_namespace,
            kueue_topologies=args.kueue_topologies,
            device_taint_rules=args.device_taint_rules,
            timeout=args.timeout,
            operator_wait=args.operator_wait,
        )
    )
