"""Kubernetes writes: server-side apply of whole manifests, deletes, status patches, events;
and the one list per kind that primes the cache before the watches take over.

Every write goes through `KubeWriter`, which counts it (`pd_operator_api_writes_total`), so
tests and benchmarks can prove that a converged object costs zero writes.
"""

import datetime
import json
import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from pd_operator.adapters import metrics
from pd_operator.api import GROUP, PLURAL, VERSION
from pd_operator.api.document import yaml_problem
from pd_operator.api.pdpool import POOL_KIND, POOL_PLURAL
from pd_operator.core.children import MANAGED_BY
from pd_operator.core.observe import DELETION_COST

logger = logging.getLogger(__name__)

FIELD_MANAGER = "pd-operator"
# The resource version of etcd's first revision, which no object the operator could meet holds:
# as an apply's precondition it means "only if no object has this name" (`KubeWriter.create`).
ABSENT = "1"

# Plural resource names of the kinds the operator manages.
PLURALS = {
    "Deployment": "deployments",
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "PDDeployment": PLURAL,
    POOL_KIND: POOL_PLURAL,
    "LeaderWorkerSet": "leaderworkersets",
}


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client from a kubeconfig, the in-cluster service account, or ~/.kube/config.

    ValueError says which was tried and what is wrong (a missing or broken kubeconfig).
    """
    if kubeconfig:
        if not Path(kubeconfig).is_file():
            raise ValueError(f"{kubeconfig}: no such file")
        try:
            api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        except config.ConfigException as error:
            raise ValueError(f"{kubeconfig}: {error}") from None
        except yaml.YAMLError as error:
            raise ValueError(f"{kubeconfig}: {yaml_problem(error)}") from None
        return api
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    except config.ConfigException:
        pass
    try:
        api = config.new_client_from_config()  # type: ignore[no-untyped-call]
    except (config.ConfigException, yaml.YAMLError) as error:
        problem = yaml_problem(error) if isinstance(error, yaml.YAMLError) else error
        raise ValueError(
            f"not in a cluster, and no usable kubeconfig ({problem}): pass --kubeconfig PATH"
            " or set KUBECONFIG"
        ) from None
    return api


def api_message(error: ApiException) -> str:
    """The apiserver's own words for a refused request (its Status message), else the reason."""
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.reason)


def object_path(api_version: str, kind: str, namespace: str, name: str = "") -> str:
    """The REST path of a namespaced object (or its collection when name is empty)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


def call_json(
    api_client: client.ApiClient,
    method: str,
    path: str,
    body: Any,
    content_type: str = "application/json",
    *,
    query: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """One REST call with a JSON (or apply-patch) body; the answer as plain JSON.
    ApiException on anything but 2xx."""
    if content_type.endswith("yaml") and body is not None:
        # An apply is parsed as YAML, which has no JSON surrogate pairs: the client's own
        # json.dumps escapes an emoji as two of them and the apiserver refuses the body.
        body = json.dumps(body, ensure_ascii=False).encode()
    method, url, headers, payload, _ = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(method, url, header_params=headers, body=payload)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status < 300:
        raise ApiException.from_response(http_resp=response, body=data.decode(), data=None)
    result: dict[str, Any] = json.loads(data) if data else {}
    return result


# LeaderWorkerSet (sigs.k8s.io/lws): the workload of a pool whose replica spans several nodes.
LWS_RESOURCE = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
# The kinds of children: (API group, version, plural), watched and listed by our label only.
CHILD_RESOURCES: tuple[tuple[str, str, str], ...] = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    (GROUP, VERSION, POOL_PLURAL),
    LWS_RESOURCE,
)
# Children whose CRD may be missing (installed before this operator's version, or LWS not
# installed: only multi-node pools need it): not listed while priming; kopf's watch starts once
# the CRD is served.
OPTIONAL_CHILD_RESOURCES = frozenset({(GROUP, VERSION, POOL_PLURAL), LWS_RESOURCE})
# One namespace's (or the cluster's) children of every kind, then its pods.
Listing = tuple[list[dict[str, Any]], list[dict[str, Any]]]
# A list refused while priming: the RBAC applied is older (or narrower) than this operator.
RBAC_FIX = (
    "apply the RBAC of this operator's version: `helm upgrade` of its chart, or "
    "`kubectl apply -k config/default` (docs/install.md, 'What the operator may do')"
)


def list_cluster(
    api_client: client.ApiClient, namespaces: list[str], *, other_pods: bool
) -> tuple[list[Listing], list[dict[str, Any]]]:
    """Our children and the pods (other workloads' too with `other_pods`), per namespace (or
    once cluster-wide when none is given), and the nodes: what the cache is primed with.

    PermissionError names the list the operator's RBAC refused and the fix."""
    pod_selector = "" if other_pods else MANAGED_SELECTOR
    try:
        listings: list[Listing] = []
        for namespace in namespaces or [""]:
            children = [
                child
                for resource in CHILD_RESOURCES
                for child in _list_children(api_client, resource, namespace)
            ]
            pods = _list(api_client, "v1", "pods", namespace, pod_selector)
            listings.append((children, pods))
        return listings, _list(api_client, "v1", "nodes", "", "")
    except ApiException as error:
        if error.status != 403:
            raise
        raise PermissionError(f"{api_message(error)}: {RBAC_FIX}") from None


def _list(
    api_client: client.ApiClient, api_version: str, plural: str, namespace: str, selector: str
) -> list[dict[str, Any]]:
    """Every object of a kind (in a namespace, or everywhere), with apiVersion and kind set:
    items of a list carry neither, and the cache keys on them."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    query = [("labelSelector", selector)] if selector else []
    listed = call_json(api_client, "GET", path, None, query=query)
    kind = listed.get("kind", "").removesuffix("List")
    return [{**item, "apiVersion": api_version, "kind": kind} for item in listed["items"]]


def _list_children(
    api_client: client.ApiClient, resource: tuple[str, str, str], namespace: str
) -> list[dict[str, Any]]:
    group, version, plural = resource
    api_version = f"{group}/{version}" if group else version
    try:
        return _list(api_client, api_version, plural, namespace, MANAGED_SELECTOR)
    except ApiException as error:
        if error.status != 404 or resource not in OPTIONAL_CHILD_RESOURCES:
            raise
        if resource == LWS_RESOURCE:
            # Only multi-node pools need it; say so once, at start, not as a fault.
            logger.info(
                "%s.%s is not served: pools with accelerator.nodesPerReplica > 1 need "
                "LeaderWorkerSet (sigs.k8s.io/lws) installed",
                plural,
                group,
            )
        else:
            logger.warning("%s.%s is not served: apply the CRDs of this version", plural, group)
        return []


class KubeWriter:
    """The operator's only way to change the cluster."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    def _call(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str,
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        return call_json(self.api_client, method, path, body, content_type, query=query)

    def apply(self, manifest: Mapping[str, Any], uid: str) -> dict[str, Any]:
        """Server-side apply a complete manifest over the object `uid`, which we own, taking back
        conflicting fields. The uid is a precondition: an object deleted since (409) or
        replaced by another of the same name (422 on metadata.uid) is never written."""
        return self._apply(manifest, {"uid": uid}, verb="apply")

    def create(self, manifest: Mapping[str, Any], *, as_applied: bool = True) -> dict[str, Any]:
        """Create a child that must not exist yet: 409 if any object holds the name (an apply
        would take the other object over).

        One server-side apply whose precondition is a resource version no stored object has
        (`ABSENT`): the apiserver creates the object when the name is free, with our fields
        under our Apply entry exactly as a later apply records them (so a field later dropped
        from the spec goes), and refuses it when the name is taken. `as_applied=False`
        creates with a plain POST instead, whose fields stay with an Update entry: for a field
        set on creation only (a PDPool's spec.replicas, then HPA's), which a later apply that
        leaves it out must not remove."""
        if as_applied:
            return self._apply(manifest, {"resourceVersion": ABSENT}, verb="create")
        meta = manifest["metadata"]
        created = self._call(
            "POST",
            object_path(manifest["apiVersion"], manifest["kind"], meta["namespace"]),
            dict(manifest),
            "application/json",
            [("fieldManager", FIELD_MANAGER), ("fieldValidation", "Strict")],
        )
        metrics.API_WRITES.labels(verb="create", kind=manifest["kind"]).inc()
        return created

    def _apply(
        self, manifest: Mapping[str, Any], precondition: Mapping[str, str], *, verb: str
    ) -> dict[str, Any]:
        meta = manifest["metadata"]
        path = object_path(
            manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]
        )
        body = {**manifest, "metadata": {**meta, **precondition}}
        result = self._call(
            "PATCH",
            path,
            body,
            "application/apply-patch+yaml",
            [("fieldManager", FIELD_MANAGER), ("force", "true")],
        )
        metrics.API_WRITES.labels(verb=verb, kind=manifest["kind"]).inc()
        return result

    def find(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object of that name, or None: a list by name, as the operator may list but not
        get its kinds. A read; counts no write."""
        listed = self._call(
            "GET",
            object_path(api_version, kind, namespace),
            None,
            "application/json",
            [("fieldSelector", f"metadata.name={name}")],
        )
        items = listed.get("items") or []
        return {**items[0], "apiVersion": api_version, "kind": kind} if items else None

    def delete(self, api_version: str, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete one object, only if it is still the one we saw (uid precondition)."""
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            self._call(
                "DELETE", object_path(api_version, kind, namespace, name), body, "application/json"
            )
        except ApiException as error:
            if error.status not in (404, 409):
                raise
        metrics.API_WRITES.labels(verb="delete", kind=kind).inc()

    def patch_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        kind: str = "PDDeployment",
        uid: str | None = None,
    ) -> dict[str, Any]:
        """Replace the status of a PDDeployment (or a PDPool) whole (we own all of it): a merge
        patch would keep every key it does not name, so a value that became unknown would stay
        at its last one. `uid`: only if the object is still that one (422 otherwise)."""
        path = object_path(f"{GROUP}/{VERSION}", kind, namespace, name) + "/status"
        replace: list[dict[str, Any]] = (
            [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []
        )
        replace.append({"op": "add", "path": "/status", "value": dict(status)})
        result = self._call("PATCH", path, replace, "application/json-patch+json")
        metrics.API_WRITES.labels(verb="patch_status", kind=kind).inc()
        return result

    def set_deletion_cost(self, namespace: str, name: str, uid: str, cost: int) -> None:
        """Annotate one pod with the cost its ReplicaSet reads to choose which pod to remove;
        only if it is still that pod (the uid is a precondition: 422 otherwise)."""
        body = {"metadata": {"uid": uid, "annotations": {DELETION_COST: str(cost)}}}
        self._call(
            "PATCH",
            object_path("v1", "Pod", namespace, name),
            body,
            "application/merge-patch+json",
            [("fieldManager", FIELD_MANAGER)],
        )
        metrics.API_WRITES.labels(verb="patch", kind="Pod").inc()

    def post_event(
        self, involved: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        """Post a core/v1 Event about a PDDeployment (or a child)."""
        meta = involved["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/events", event, "application/json"
        )
        metrics.API_WRITES.labels(verb="create", kind="Event").inc()
