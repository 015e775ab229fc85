"""Who is enrolling: the agent's projected ServiceAccount token, checked by the API server.

A TokenReview with audience `netval` says whose token it is; a pod-bound token carries the
pod's name and uid (and, from Kubernetes 1.30, its node) in `status.user.extra`. The Pod
itself, read back, must have that uid, run as the agents' ServiceAccount with the agents'
labels, and be scheduled: its `spec.nodeName` is the node the credential is for. The node
therefore comes from the API server, never from the request. Its controller must be one of
netval's agent DaemonSets, read back too (once per DaemonSet uid): anyone who may create
Pods with the agents' ServiceAccount could otherwise write the labels themselves. The
DaemonSet's controlling NetworkValidation is the validation the credential is for: a pod
speaks only for the validation whose DaemonSet runs it.

The checks of what the API server said are pure (`pod_ref_of`, `agent_node_of`,
`daemonset_owner_of`, `check_agent_daemonset`); the calls run in a worker thread (the
official client is synchronous).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netval.model.keys import MANAGED_BY_OPERATOR, LabelKey
from netval.model.manifest import API_GROUP
from netval.model.topics import check_topic_level
from netval.operator.agents.agent_names import AGENT_OBJECT_PREFIX
from netval.operator.agents.manifests import AGENT_APP_NAME, AGENT_SERVICE_ACCOUNT
from netval.operator.thread_pools import PROCESS_POOLS, Concern

AUDIENCE: Final = "netval"
EXTRA_POD_NAME: Final = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID: Final = "authentication.kubernetes.io/pod-uid"
EXTRA_NODE_NAME: Final = "authentication.kubernetes.io/node-name"
API_TIMEOUT: Final = 10.0
MAX_OWNERS: Final = 1024  # DaemonSets verified (one per validation): far more than a cluster has
AGENT_POD_LABELS: Final[Mapping[str, str]] = {
    LabelKey.NAME.value: AGENT_APP_NAME,
    LabelKey.MANAGED_BY.value: MANAGED_BY_OPERATOR,
}


class EnrollmentDenied(Exception):
    """The token does not prove an agent pod of this installation (answered 403; the
    message names the check, never the token)."""


class ReviewUnavailable(Exception):
    """The API server could not be asked (answered 503: the agent retries)."""


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    node: str | None  # from the token, when the API server puts it there (1.30+)


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """The DaemonSet a Pod says controls it."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class AgentPod:
    namespace: str
    name: str
    uid: str
    node: str
    validation: str = ""  # the NetworkValidation controlling the pod's DaemonSet


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _one(extra: Mapping[str, Any], key: str) -> str | None:
    values = extra.get(key)
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0] or None
    return None


def pod_ref_of(
    status: Mapping[str, Any], *, namespace: str, service_account: str = AGENT_SERVICE_ACCOUNT
) -> PodRef:
    """The pod a TokenReview status names, if it is an authenticated, `netval`-audience,
    pod-bound token of the agents' ServiceAccount."""
    if status.get("authenticated") is not True:
        raise EnrollmentDenied("the token was not authenticated for audience netval")
    audiences = status.get("audiences")
    if not isinstance(audiences, list) or AUDIENCE not in audiences:
        raise EnrollmentDenied("the token is not for audience netval")
    user = _dict(status.get("user"))
    expected = f"system:serviceaccount:{namespace}:{service_account}"
    if user.get("username") != expected:
        raise EnrollmentDenied(f"the token is not the agents' ServiceAccount ({expected})")
    extra = _dict(user.get("extra"))
    name, uid = _one(extra, EXTRA_POD_NAME), _one(extra, EXTRA_POD_UID)
    if name is None or uid is None:
        raise EnrollmentDenied("the token is not bound to a pod (use a projected token)")
    return PodRef(namespace, name, uid, _one(extra, EXTRA_NODE_NAME))


def agent_node_of(
    ref: PodRef, pod: Mapping[str, Any] | None, *, service_account: str = AGENT_SERVICE_ACCOUNT
) -> AgentPod:
    """The node of the pod `ref` names, if the Pod read back is that agent pod."""
    if pod is None:
        raise EnrollmentDenied(f"pod {ref.namespace}/{ref.name} does not exist")
    meta, spec = _dict(pod.get("metadata")), _dict(pod.get("spec"))
    if meta.get("uid") != ref.uid:
        raise EnrollmentDenied(f"pod {ref.namespace}/{ref.name} has another uid than the token")
    if meta.get("deletionTimestamp"):
        raise EnrollmentDenied(f"pod {ref.namespace}/{ref.name} is terminating")
    if spec.get("serviceAccountName") != service_account:
        raise EnrollmentDenied(f"pod {ref.namespace}/{ref.name} does not run as {service_account}")
    labels = _dict(meta.get("labels"))
    if any(labels.get(k) != v for k, v in AGENT_POD_LABELS.items()):
        raise EnrollmentDenied(f"pod {ref.namespace}/{ref.name} is not a netval agent pod")
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        raise EnrollmentDenied(f"pod {ref.namespace}/{ref.name} is not scheduled on a node")
    if ref.node is not None and ref.node != node:
        raise EnrollmentDenied(
            f"pod {ref.namespace}/{ref.name} runs on another node than the token"
        )
    try:
        check_topic_level(node, "node name")
    except ValueError as exc:
        raise EnrollmentDenied(str(exc)) from None
    return AgentPod(ref.namespace, ref.name, ref.uid, node)


def daemonset_owner_of(ref: PodRef, pod: Mapping[str, Any]) -> OwnerRef:
    """The agent DaemonSet the Pod names as its controller. A Pod's ownerReferences are
    written by whoever creates it, so this only says which DaemonSet to read back
    (`check_agent_daemonset`)."""
    refs = _dict(pod.get("metadata")).get("ownerReferences")
    for owner in refs if isinstance(refs, list) else []:
        owner = _dict(owner)
        if owner.get("controller") is not True:
            continue
        name, uid = owner.get("name"), owner.get("uid")
        if (
            owner.get("apiVersion") == "apps/v1"
            and owner.get("kind") == "DaemonSet"
            and isinstance(name, str)
            and name.startswith(AGENT_OBJECT_PREFIX)
            and isinstance(uid, str)
            and uid
        ):
            return OwnerRef(ref.namespace, name, uid)
        break  # one controller at most: another kind is not an agent pod
    raise EnrollmentDenied(
        f"pod {ref.namespace}/{ref.name} is not controlled by a netval agent DaemonSet"
    )


def check_agent_daemonset(owner: OwnerRef, daemonset: Mapping[str, Any] | None) -> str:
    """The DaemonSet read back is the one the Pod names (same uid), carries the agents'
    labels and is controlled by a NetworkValidation: one the operator manages. Returns that
    validation's name."""
    what = f"DaemonSet {owner.namespace}/{owner.name}"
    if daemonset is None:
        raise EnrollmentDenied(f"{what} does not exist")
    meta = _dict(daemonset.get("metadata"))
    if meta.get("uid") != owner.uid:
        raise EnrollmentDenied(f"{what} has another uid than the pod's owner reference")
    labels = _dict(meta.get("labels"))
    if any(labels.get(k) != v for k, v in AGENT_POD_LABELS.items()):
        raise EnrollmentDenied(f"{what} is not managed by netval")
    refs = meta.get("ownerReferences")
    for o in refs if isinstance(refs, list) else []:
        o = _dict(o)
        name = o.get("name")
        if (
            o.get("kind") == "NetworkValidation"
            and str(o.get("apiVersion", "")).startswith(f"{API_GROUP}/")
            and o.get("controller") is True
            and isinstance(name, str)
        ):
            try:
                return check_topic_level(name, "validation name")
            except ValueError as exc:
                raise EnrollmentDenied(f"{what}: {exc}") from None
    raise EnrollmentDenied(f"{what} is not controlled by a NetworkValidation")


class PodTokenReviewer:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str,
        service_account: str = AGENT_SERVICE_ACCOUNT,
    ) -> None:
        self.api_client = api_client
        self.auth = client.AuthenticationV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.apps_api = client.AppsV1Api(api_client)
        self.namespace = namespace
        self.service_account = service_account
        # DaemonSets verified, by (namespace, name, uid), with their validation: a uid is
        # never reused, so a verified one stays verified (one GET per validation, not per
        # enrollment)
        self._owners: dict[OwnerRef, str] = {}

    async def review(self, token: str) -> AgentPod:
        status = await PROCESS_POOLS.run(Concern.ENROLL, self._token_review, token)
        ref = pod_ref_of(status, namespace=self.namespace, service_account=self.service_account)
        pod = await PROCESS_POOLS.run(Concern.ENROLL, self._read_pod, ref)
        agent = agent_node_of(ref, pod, service_account=self.service_account)
        assert pod is not None  # agent_node_of refuses a missing pod
        owner = daemonset_owner_of(ref, pod)
        validation = self._owners.get(owner)
        if validation is None:
            found = await PROCESS_POOLS.run(Concern.ENROLL, self._read_daemonset, owner)
            validation = self._owners[owner] = check_agent_daemonset(owner, found)
            while len(self._owners) > MAX_OWNERS:
                del self._owners[next(iter(self._owners))]
        return dataclasses.replace(agent, validation=validation)

    def _token_review(self, token: str) -> dict[str, Any]:
        body = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=[AUDIENCE])
        )
        try:
            answer = self.auth.create_token_review(body, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            raise ReviewUnavailable(f"TokenReview failed: HTTP {exc.status}") from None
        except Exception as exc:  # connection refused, timeout, ...
            raise ReviewUnavailable(f"TokenReview failed: {type(exc).__name__}") from None
        doc = self.api_client.sanitize_for_serialization(answer)  # type: ignore[no-untyped-call]
        return dict(doc.get("status") or {})

    def _read_pod(self, ref: PodRef) -> dict[str, Any] | None:
        try:
            pod = self.core.read_namespaced_pod(
                ref.name, ref.namespace, _request_timeout=API_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ReviewUnavailable(f"reading the pod failed: HTTP {exc.status}") from None
        except Exception as exc:
            raise ReviewUnavailable(f"reading the pod failed: {type(exc).__name__}") from None
        return dict(self.api_client.sanitize_for_serialization(pod))  # type: ignore[no-untyped-call]

    def _read_daemonset(self, owner: OwnerRef) -> dict[str, Any] | None:
        try:
            found = self.apps_api.read_namespaced_daemon_set(
                owner.name, owner.namespace, _request_timeout=API_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ReviewUnavailable(f"reading the DaemonSet failed: HTTP {exc.status}") from None
        except Exception as exc:
            raise ReviewUnavailable(f"reading the DaemonSet failed: {type(exc).__name__}") from None
        return dict(self.api_client.sanitize_for_serialization(found))  # type: ignore[no-untyped-call]
