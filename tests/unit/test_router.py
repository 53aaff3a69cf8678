"""The PD router in front of the pools: its objects, its command line, its status."""

import copy

import pytest
from sglang_router.launch_router import parse_router_args as parse_sglang_router_args
from vllm_router.launch_router import parse_router_args

from pd_operator import __version__
from pd_operator.activator.__main__ import parse as parse_activator_args
from pd_operator.api import InvalidSpecError, parse_pddeployment
from pd_operator.core.children import desired_children, revision
from pd_operator.core.reconcile import plan_children
from pd_operator.core.router import (
    ACTIVATOR_METRICS_PORT_NAME,
    DEFAULT_ACTIVATOR_IMAGE,
    DEFAULT_IMAGES,
    INTERNAL_PORT,
    build_endpoint_service,
    build_router_deployment,
    endpoint_url,
    router_children,
    router_command,
)
from pd_operator.core.status import compute_status
from pdcases import IDLE, ROOT, minimal, mutate
from schema_tools import apply_defaults, crd_schema


def pdd(document=None, namespace="llm"):
    document = copy.deepcopy(document or minimal())
    document["metadata"].update(namespace=namespace, uid="uid-1", generation=1)
    return parse_pddeployment(document)


def by_kind(children):
    return {child["kind"]: child for child in children}


def flag_values(argv, flag):
    """The words after `flag` up to the next flag."""
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def test_a_router_is_on_by_default_with_its_own_identity_and_an_endpoint_named_after_the_object():
    children = by_kind(router_children(pdd()))
    assert set(children) == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    }
    assert children["Service"]["metadata"]["name"] == "minimal"
    pod = children["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "minimal-router"
    assert children["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "minimal-router", "namespace": "llm"}
    ]
    assert children["RoleBinding"]["roleRef"]["name"] == children["Role"]["metadata"]["name"]
    assert endpoint_url(pdd()) == "http://minimal.llm.svc:8000"
    for child in children.values():
        assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_the_routers_role_reads_pods_of_its_namespace_and_nothing_else():
    role = by_kind(router_children(pdd()))["Role"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]


def test_the_router_finds_only_this_objects_pods_in_its_namespace_in_pd_mode():
    argv = router_command(pdd())
    assert argv[:2] == ["vllm-router", "--vllm-pd-disaggregation"]
    assert "--service-discovery" in argv
    assert flag_values(argv, "--service-discovery-namespace") == ["llm"]
    assert flag_values(argv, "--service-discovery-port") == ["8000"]
    # Only the spec's revision: new prefill never hands off to old decode (nor the reverse).
    serving = f"pdoperator.io/revision={revision(pdd())}"
    assert sorted(flag_values(argv, "--prefill-selector")) == [
        "pdoperator.io/deployment=minimal",
        serving,
        "pdoperator.io/role=prefill",
    ]
    assert sorted(flag_values(argv, "--decode-selector")) == [
        "pdoperator.io/deployment=minimal",
        serving,
        "pdoperator.io/role=decode",
    ]


def test_during_a_rollout_the_router_selects_the_revision_it_is_told_and_says_so():
    argv = router_command(pdd(), "abc123")
    for flag, role in (("--prefill-selector", "prefill"), ("--decode-selector", "decode")):
        assert sorted(flag_values(argv, flag)) == [
            "pdoperator.io/deployment=minimal",
            "pdoperator.io/revision=abc123",
            f"pdoperator.io/role={role}",
        ]
    deployment = build_router_deployment(pdd(), serving="abc123")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["pdoperator.io/revision"] == "abc123"
    # The selector is immutable: the revision never enters it.
    assert "pdoperator.io/revision" not in deployment["spec"]["selector"]["matchLabels"]
    # Cache-aware prefill so that a repeated prefix lands where its KV cache is.
    assert flag_values(argv, "--prefill-policy") == ["cache_aware"]
    assert flag_values(argv, "--decode-policy") == ["power_of_two"]


def test_policies_and_extra_args_come_from_the_spec():
    document = mutate(
        "spec.router",
        {"prefillPolicy": "RoundRobin", "decodePolicy": "ConsistentHash", "args": ["--x", "1"]},
    )
    argv = router_command(pdd(document))
    assert flag_values(argv, "--prefill-policy") == ["round_robin"]
    assert flag_values(argv, "--decode-policy") == ["consistent_hash"]
    assert argv[-2:] == ["--x", "1"]


def test_sglang_gets_its_own_router_and_prefill_pods_name_their_bootstrap_port():
    document = mutate("spec.model.engine", "SGLang")
    argv = router_command(pdd(document))
    assert argv[:4] == ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    assert flag_values(argv, "--service-discovery-port") == ["30000"]
    deployment = by_kind(router_children(pdd(document)))["Deployment"]
    assert (
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] == DEFAULT_IMAGES["SGLang"]
    )
    # sglang-router reads the prefill pod's KV bootstrap port from a fixed annotation.
    pools = {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in desired_children(pdd(document), {})
        if d["kind"] == "Deployment"
    }
    prefill, decode = pools["minimal-prefill-p"], pools["minimal-decode-d"]
    assert prefill["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == "8998"
    command = prefill["spec"]["containers"][0]["command"]
    assert flag_values(command, "--disaggregation-bootstrap-port") == ["8998"]
    assert "sglang.ai/bootstrap-port" not in decode["metadata"]["annotations"]


def test_fixed_router_replicas_are_set_on_the_deployment_and_a_range_gets_an_autoscaler():
    fixed = by_kind(router_children(pdd(mutate("spec.router.replicas", {"min": 2, "max": 2}))))
    assert fixed["Deployment"]["spec"]["replicas"] == 2
    assert "HorizontalPodAutoscaler" not in fixed
    ranged = by_kind(router_children(pdd(mutate("spec.router.replicas", {"min": 1, "max": 4}))))
    # The HPA owns replicas: the operator's apply must not fight it over the field.
    assert "replicas" not in ranged["Deployment"]["spec"]
    hpa = ranged["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 4)
    assert hpa["scaleTargetRef"]["name"] == "minimal-router"


def test_router_disabled_creates_no_router_object_and_no_endpoint():
    off = pdd(mutate("spec.router", {"enabled": False}))
    assert router_children(off) == []
    kinds = {m["kind"] for m in plan_children(off, {}, []).apply}
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget"}
    names = {m["metadata"]["name"] for m in plan_children(off, {}, []).apply}
    assert "minimal" not in names and "minimal-router" not in names


def test_router_replica_bounds_are_checked_by_the_models_and_the_schema():
    document = mutate("spec.router.replicas", {"min": 3, "max": 2})
    with pytest.raises(InvalidSpecError, match=r"spec\.router\.replicas: router.replicas.min"):
        parse_pddeployment(document)
    rules = crd_schema()["properties"]["spec"]["properties"]["router"]["properties"]["replicas"]
    assert "self.min <= self.max" in str(rules["x-kubernetes-validations"])


def test_the_schema_defaults_the_router_on_with_one_replica():
    spec = apply_defaults(crd_schema(), minimal())["spec"]
    assert spec["router"]["enabled"] is True
    assert spec["router"]["replicas"] == {"min": 1, "max": 1}
    assert spec["router"]["prefillPolicy"] == "CacheAware"


def _status(document, router_ready):
    obj = pdd(document)
    plan = plan_children(obj, {}, [])
    children = {}
    for manifest in plan.apply:
        child = copy.deepcopy(manifest)
        if child["kind"] == "Deployment":
            is_router = child["metadata"]["name"].endswith("-router")
            ready = 1 if (router_ready or not is_router) else 0
            child["status"] = {
                "replicas": 1,
                "readyReplicas": ready,
                "updatedReplicas": 1,
                "observedGeneration": 0,
            }
        children[(child["apiVersion"], child["kind"], child["metadata"]["name"])] = child
    status, _ = compute_status(
        obj,
        children=children,
        pods=[],
        replicas=plan.replicas,
        problems=[],
        previous={},
        now="2026-12-05T00:00:00Z",
    )
    return status


def test_status_shows_the_endpoint_and_is_ready_only_once_the_router_is():
    waiting = _status(minimal(), router_ready=False)
    assert waiting["endpoint"] == "http://minimal.llm.svc:8000"
    assert waiting["router"] == {"replicas": 1, "readyReplicas": 0, "desiredReplicas": 1}
    ready = {c["type"]: c for c in waiting["conditions"]}["Ready"]
    assert ready["status"] == "False" and "router 0/1 ready" in ready["message"]
    served = _status(minimal(), router_ready=True)
    assert {c["type"]: c for c in served["conditions"]}["Ready"]["status"] == "True"


def test_status_without_a_router_has_no_endpoint():
    status = _status(mutate("spec.router", {"enabled": False}), router_ready=False)
    assert "endpoint" not in status and "router" not in status
    assert {c["type"]: c for c in status["conditions"]}["Ready"]["status"] == "True"


def test_an_object_named_with_a_leading_digit_gets_a_valid_endpoint_service_name():
    document = minimal()
    document["metadata"]["name"] = "1a"
    service = by_kind(router_children(pdd(document)))["Service"]
    assert service["metadata"]["name"] == "pd-1a"


def test_the_router_template_sets_image_scheduler_and_resources_but_never_the_identity():
    document = mutate(
        "spec.router.template",
        {
            "image": "registry.local/vllm-router:v0.1.17",
            "schedulerName": "pd-mock-scheduler",
            "resources": {"requests": {"cpu": "250m"}},
            "labels": {"team": "llm", "pdoperator.io/role": "spoofed"},
        },
    )
    deployment = by_kind(router_children(pdd(document)))["Deployment"]
    pod = deployment["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "pd-mock-scheduler"
    assert pod["spec"]["containers"][0]["image"] == "registry.local/vllm-router:v0.1.17"
    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "250m"}}
    # Our labels win: the Service and the Deployment select the router pods by them.
    assert pod["metadata"]["labels"]["pdoperator.io/role"] == "router"
    assert pod["metadata"]["labels"]["team"] == "llm"
    with pytest.raises(InvalidSpecError, match=r"router\.template\.serviceAccountName"):
        parse_pddeployment(mutate("spec.router.template", {"serviceAccountName": "admin"}))


def test_router_pods_get_the_pools_security_defaults_and_keep_their_token():
    pod = by_kind(router_children(pdd()))["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    # Its service discovery watches pods with its ServiceAccount's token.
    assert "automountServiceAccountToken" not in pod
    restricted = {"runAsNonRoot": True, "runAsUser": 65532}
    document = mutate("spec.router.template", {"securityContext": restricted})
    pod = by_kind(router_children(pdd(document)))["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, **restricted}
    for field in ("automountServiceAccountToken", "shmSize"):
        with pytest.raises(InvalidSpecError, match=rf"router\.template\.{field}"):
            parse_pddeployment(mutate("spec.router.template", {field: "1Gi"}))


def test_the_installed_vllm_router_accepts_the_command_line_the_operator_builds():
    # The router's own parser (from the pinned wheel): a flag it does not know would crash the
    # router pod at start.
    document = mutate("spec.router.replicas", {"min": 1, "max": 3})
    built = pdd(document)
    argv = router_command(built)
    assert argv[0] == "vllm-router"
    parsed = parse_router_args(argv[1:])
    assert parsed.vllm_pd_disaggregation and parsed.service_discovery
    assert parsed.prefill_selector == {
        "pdoperator.io/deployment": "minimal",
        "pdoperator.io/role": "prefill",
        "pdoperator.io/revision": revision(built),
    }
    assert parsed.service_discovery_namespace == "llm"
    assert (parsed.host, parsed.port, parsed.prometheus_port) == ("0.0.0.0", 8000, 29000)


def test_the_installed_sglang_router_accepts_the_command_line_the_operator_builds():
    built = pdd(mutate("spec.model.engine", "SGLang"))
    argv = router_command(built)
    assert argv[:3] == ["python3", "-m", "sglang_router.launch_router"]
    parsed = parse_sglang_router_args(argv[3:])
    assert parsed.pd_disaggregation and parsed.service_discovery
    assert parsed.decode_selector == {
        "pdoperator.io/deployment": "minimal",
        "pdoperator.io/role": "decode",
        "pdoperator.io/revision": revision(built),
    }
    assert (parsed.service_discovery_port, parsed.port) == (30000, 8000)


def router_pod(document, **kwargs):
    (deployment,) = [
        c for c in router_children(pdd(document), **kwargs) if c["kind"] == "Deployment"
    ]
    return deployment["spec"]["template"]["spec"]


def test_without_idle_seconds_the_router_pod_runs_the_router_alone_on_the_public_port():
    (container,) = router_pod(minimal())["containers"]
    assert container["name"] == "router"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8000,
        "metrics": 29000,
    }
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert flag_values(container["command"], "--port") == ["8000"]


def test_with_idle_seconds_the_activator_takes_the_public_port_and_the_router_moves_inside():
    router, activator = router_pod(IDLE, activator_image="registry.example/pd-operator:9")[
        "containers"
    ]
    assert activator["name"] == "activator"
    assert activator["image"] == "registry.example/pd-operator:9"
    assert activator["command"][:3] == ["python", "-m", "pd_operator.activator"]
    assert {p["name"]: p["containerPort"] for p in activator["ports"]} == {
        "http": 8000,
        ACTIVATOR_METRICS_PORT_NAME: 29001,
    }
    # The activator answers /health itself: the pod stays Ready with no workers.
    assert activator["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # It reaches the router on the pod's own address, which the downward API gives.
    assert flag_values(activator["command"], "--upstream") == [f"http://$(POD_IP):{INTERNAL_PORT}"]
    assert activator["env"] == [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    ]
    ports = {p["name"]: p["containerPort"] for p in router["ports"]}
    assert ports == {"router-http": INTERNAL_PORT, "metrics": 29000}
    assert flag_values(router["command"], "--port") == [str(INTERNAL_PORT)]
    # vllm-router's /readiness fails with no workers, the normal state at zero.
    assert router["readinessProbe"]["httpGet"] == {"path": "/health", "port": "router-http"}
    assert router["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "router-http"}
    # The endpoint still targets the port named http: now the activator's.
    service = build_endpoint_service(pdd(IDLE))
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    # Port names are IANA service names: at most 15 characters.
    assert all(len(p["name"]) <= 15 for c in (router, activator) for p in c["ports"])


def test_the_activator_image_defaults_to_the_operator_image_the_chart_installs():
    chart = (ROOT / "charts" / "pd-operator" / "values.yaml").read_text()
    assert "repository: pd-operator" in chart
    (_, activator) = router_pod(IDLE)["containers"]
    assert activator["image"] == DEFAULT_ACTIVATOR_IMAGE == f"pd-operator:{__version__}"


def test_the_installed_vllm_router_accepts_the_internal_port():
    argv = router_command(pdd(IDLE))
    assert parse_router_args(argv[1:]).port == INTERNAL_PORT


def test_the_activators_own_parser_accepts_the_command_line_the_operator_builds():
    (_, activator) = router_pod(IDLE)["containers"]
    args = parse_activator_args(activator["command"][3:])
    assert (args.port, args.metrics_port, args.hold_seconds) == (8000, 29001, 300.0)
