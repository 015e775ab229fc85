"""The agent objects of one NetworkValidation in the cluster: rendered from the operator's
settings (`netval.operator.agents.manifests`) and applied, or deleted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from netval.model.spec import NetworkValidationSpec
from netval.operator.agents import manifests
from netval.operator.kube.api import KubeApi
from netval.operator.settings import OperatorSettings


def render_agents(
    settings: OperatorSettings,
    owner: Mapping[str, Any],
    generation: int,
    spec: NetworkValidationSpec,
    *,
    rdma: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ConfigMap, DaemonSet) of the validation `owner` (its object, as Kopf gives it);
    `rdma`: it has an RDMA load test (its agents get perftest's privileges)."""
    name = owner["metadata"]["name"]
    configmap = manifests.render_configmap(
        name, generation, spec, namespace=settings.agent_namespace, owner=owner
    )
    daemonset = manifests.render_daemonset(
        name,
        generation,
        spec,
        namespace=settings.agent_namespace,
        owner=owner,
        image=settings.agent_image,
        mqtt=manifests.AgentMqttWiring(
            url=settings.agent_mqtt_url,
            username=settings.agent_mqtt_username,
            # an anonymous broker, or per-node identity: no shared password to mount
            password_secret=settings.agent_mqtt_secret
            if settings.agent_mqtt_username and not settings.agent_enroll_url
            else None,
            ca_secret=settings.agent_mqtt_ca_secret,
            enroll_url=settings.agent_enroll_url,
            enroll_ca_configmap=settings.agent_enroll_ca_configmap,
            shards=settings.shard_count,
            url_pattern=settings.agent_mqtt_url_pattern,
        ),
        restart_hash=manifests.restart_hash(name, spec),
        metrics_port=manifests.metrics_port_for(name),
        resources=settings.agent_resources,
        extra_tolerations=settings.agent_tolerations,
        pod=manifests.AgentPodOptions(
            image_pull_secrets=settings.agent_image_pull_secrets,
            priority_class_name=settings.agent_priority_class_name,
            traces_sampler=settings.agent_traces_sampler,
            traces_sampler_arg=settings.agent_traces_sampler_arg,
            otel_headers_secret=settings.agent_otel_headers_secret,
            rdma_resource=settings.agent_rdma_resource,
        ),
        rdma=rdma,
    )
    return configmap, daemonset


async def apply_agents(
    kube: KubeApi,
    settings: OperatorSettings,
    owner: Mapping[str, Any],
    generation: int,
    spec: NetworkValidationSpec,
    *,
    rdma: bool = False,
) -> None:
    configmap, daemonset = render_agents(settings, owner, generation, spec, rdma=rdma)
    await kube.apply_configmap(configmap)
    await kube.apply_daemonset(daemonset)


async def delete_agents(kube: KubeApi, settings: OperatorSettings, validation: str) -> None:
    # Owner references would let the garbage collector do this; deleting explicitly makes
    # removal immediate and independent of GC.
    await kube.delete_agent_objects(
        settings.agent_namespace, manifests.agent_object_name(validation)
    )
