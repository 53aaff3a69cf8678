"""Random PDDeployment documents for the fuzz test (tests/integration/test_fuzz.py).

Each document starts from `minimal()` or a sample, gets a name that its children's names may
read two ways (words such as prefill, router, digits first), and then 1-4 mutations: some drawn
from the CRD schema itself (every field, its bounds, enums and patterns, so a new field is
fuzzed without editing this file), some built by hand for what the schema cannot say (min over
max, duplicate keys, schedules naming pools, time zones, tolerations, resource requests over
limits). Values lean valid about three times in four, so that roughly half the documents are
admitted. Free-form pass-through fields (affinity, volumes, securityContext, ...) only ever get
values that are valid core/v1 objects: what the apiserver refuses there is the user's to fix.
The `*_SUSPECT` values are valid to the models and were suspected (and found, issue #28) to be
refused by the pod validation the apiserver runs on the children.

Everything is drawn from one `random.Random(seed)`: the same seed gives the same documents.
"""

import copy
import functools
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pd_operator.api.crd import build_crd
from pd_operator.api.spec import CLOCK_TIME_PATTERN, TIME_ZONE_PATTERN
from pd_operator.api.types import (
    DNS_LABEL_PATTERN,
    ENV_NAME_PATTERN,
    QUALIFIED_NAME_PATTERN,
    QUANTITY_PATTERN,
)
from pdcases import SAMPLES, load_sample, minimal

# Names built from these read two ways when joined ("a-prefill" + pool "x" and "a" + pool
# "prefill-x"), start with a digit, or look like the `pd-` prefix of a digit-first Service.
NAME_WORDS = ["a", "b", "glm", "prefill", "decode", "router", "pd", "1", "2a", "x"]
POOL_WORDS = ["p", "d", "x", "prefill", "decode", "router", "1", "a-b", "s5000", "h200"]
INVALID_NAMES = ["GLM", "a_b", "-a", "a-", "a.b", "", "é", "a\n", "a" * 64]
INVALID_POOL_NAMES = ["P", "a_b", "-p", "p-", "", "p" * 33, "p.q", "p\n"]

MUTATIONS_PER_DOCUMENT = (1, 4)
VALID_SHARE = 0.75


@dataclass
class Case:
    """One generated document and how it was made (enough to rebuild it by hand)."""

    index: int
    base: str
    mutations: list[str] = field(default_factory=list)
    document: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"#{self.index} from {self.base}: " + "; ".join(self.mutations)


# --- values by kind ---------------------------------------------------------------------------

INVALID_SCALARS: list[Any] = [True, "1", 1.5, [], {}]
HUGE_INTS = [2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]

QUANTITIES_VALID = ["1", "0", "2", "500m", "1.5", "1.5Gi", "16Gi", "64Mi", "1k", "1Ki", "0.5"]
# Valid quantities whose canonical form differs from what was written (the apiserver rounds
# and rewrites them): a stored child must still read as converged.
QUANTITIES_ODD = ["1.5m", "0.1m", "1000m", "1024Mi", "0.0001", "1.000", "007", "9999999999E"]
QUANTITIES_INVALID = ["lots", "1.2.3", "1e3", "-1", "1GB", "", " 1", "+1", "1.", ".5", "1\n"]
TIME_ZONES_VALID = ["UTC", "Asia/Shanghai", "Etc/GMT+8", "America/Argentina/Buenos_Aires", "GMT0"]
# The right shape for an IANA name, but no such zone: only the models know (see ALLOWED in
# test_fuzz.py).
TIME_ZONES_UNKNOWN = ["Asia/Shangai", "Mars/Olympus", "UTC/UTC", "Etc/GMT+99"]
TIME_ZONES_INVALID = ["../etc/passwd", "Asia/Shanghai time", "", "x" * 65, "1UTC", "UTC\n", "/UTC"]
CLOCK_VALID = ["00:00", "09:00", "23:59", "18:30"]
CLOCK_INVALID = ["24:00", "9:00", "09:60", "0900", "", "09:00\n", "09:00:00"]
QUALIFIED_VALID = ["example.com/gpu", "gpu", "a.b/c_d.e", "A1", "nvidia.com/gpu.product"]
QUALIFIED_INVALID = ["bad key!", "/x", "a/", "a/b/c", "", "-a", "Example.com/x"]
LABEL_VALUES_VALID = ["", "a", "v1.2_3-x", "x" * 63]
LABEL_VALUES_INVALID = ["x" * 64, 1]
ENV_NAMES_VALID = ["X", "_X", "a.b-c", "VLLM_LOGGING_LEVEL", "HF_HOME", "x1"]
ENV_NAMES_INVALID = ["1X", "A=B", "", "a b", "x" * 257]
DNS_VALID = ["a", "x1", "a-b", "1", "peak", "w" * 63]
DNS_INVALID = ["A", "a_b", "-a", "a-", "", "a.b", "w" * 64]
TEXT_VALID = ["x", "zai-org/GLM-4.6-FP8", "模型-π", "with space", "😀" * 8, "--flag=1"]


def _strings(node: dict[str, Any], valid: bool) -> list[Any]:
    """Values for a string field without a known pattern."""
    low, high = node.get("minLength", 0), node.get("maxLength", 64)
    if valid:
        return [*(t for t in TEXT_VALID if low <= len(t) <= high), "y" * high, "😀" * high]
    out: list[Any] = [1, True, "y" * (high + 1), "😀" * (high + 1)]
    if low:
        out.append("")
    return out


# (valid, invalid) values for the schema's patterns.
PATTERN_VALUES: dict[str, tuple[list[Any], list[Any]]] = {
    DNS_LABEL_PATTERN: (DNS_VALID, DNS_INVALID),
    QUALIFIED_NAME_PATTERN: (QUALIFIED_VALID, QUALIFIED_INVALID),
    ENV_NAME_PATTERN: (ENV_NAMES_VALID, ENV_NAMES_INVALID),
    QUANTITY_PATTERN: (QUANTITIES_VALID + QUANTITIES_ODD, QUANTITIES_INVALID),
    TIME_ZONE_PATTERN: (TIME_ZONES_VALID, TIME_ZONES_UNKNOWN + TIME_ZONES_INVALID),
    CLOCK_TIME_PATTERN: (CLOCK_VALID, CLOCK_INVALID),
    r"^[a-z0-9][-a-z0-9.]*$": (["h200", "mtt-s5000", "a.b", "9"], ["H200", "-a", "", "a b"]),
    r"^https?://": (
        ["http://prometheus:9090", "https://p.example.com/prom"],
        ["prometheus:9090", "ftp://x", "", "HTTP://x"],
    ),
}


def _rules(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node.get("x-kubernetes-validations") or [])


def _integers(node: dict[str, Any], valid: bool) -> list[Any]:
    low = node.get("minimum", 0)
    high = node.get("maximum", low + 100)
    rule_reads_it = any("type(self) == int" in r["rule"] for r in _rules(node))
    if valid:
        out: list[Any] = [low, high, low + 1, min(high, low + 3)]
        if not rule_reads_it:
            out.append(float(min(high, low + 1)))  # JSON's 2.0 is an integer to the schema
        if "maximum" not in node:
            out += HUGE_INTS[:1]
        return out
    return [low - 1, high + 1, float(low) + 0.5, float(low), *INVALID_SCALARS, *HUGE_INTS]


def scalar_values(node: dict[str, Any], valid: bool) -> list[Any]:
    """Candidate values for a scalar schema node, valid-leaning or invalid-leaning."""
    kind = node.get("type")
    if "enum" in node:
        enum = list(node["enum"])
        if valid:
            return enum
        return [
            *(e.lower() for e in enum),
            *(e.upper() for e in enum),
            "Unknown",
            "",
            1,
            "x" * 40_000,
        ]
    if kind == "boolean":
        return [True, False] if valid else ["true", "false", 1, 0, "yes"]
    if kind == "integer":
        return _integers(node, valid)
    if kind == "string":
        pattern = node.get("pattern")
        if pattern in PATTERN_VALUES:
            good, bad = PATTERN_VALUES[pattern]
            return good if valid else [*bad, 1]
        return _strings(node, valid)
    return []


# Valid core/v1 values for the pass-through fields, by field name.
PASSTHROUGH: dict[str, list[Any]] = {
    "affinity": [
        {},
        {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"app": "x"}},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "zone", "operator": "In", "values": ["a", "b"]}
                            ]
                        }
                    ]
                }
            }
        },
    ],
    "securityContext": [
        {},
        {"runAsNonRoot": True, "runAsUser": 1000},
        {"fsGroup": 2000, "runAsGroup": 3000},
        {"seccompProfile": {"type": "Unconfined"}},
        {"seccompProfile": None},
        {"sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]},
    ],
    "containerSecurityContext": [
        {},
        {"capabilities": {"add": ["IPC_LOCK", "SYS_PTRACE"]}},
        {"capabilities": None},
        {"runAsUser": 0, "readOnlyRootFilesystem": True},
        {"allowPrivilegeEscalation": None},
        {"allowPrivilegeEscalation": True},
        # Valid on its own; with the operator's allowPrivilegeEscalation: false it is not.
        {"privileged": True},
    ],
    # A pool's template patch: valid core/v1 pod-template changes the models accept too.
    "patch": [
        {},
        {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"}}},
        {
            "spec": {
                "containers": [{"name": "engine", "env": [{"name": "NCCL_IB_HCA", "value": "x"}]}]
            }
        },
        {"spec": {"dnsConfig": {"options": [{"name": "ndots", "value": "2"}]}}},
        {"spec": {"containers": [{"name": "exporter", "image": "exporter:1"}]}},
    ],
    "topologySpreadConstraints[]": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
        },
        {
            "maxSkew": 2,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "x"}},
        },
    ],
}
# (volumes, volumeMounts): valid together (a mount names a volume of the pod).
VOLUME_SETS: list[tuple[list[Any], list[Any]]] = [
    ([], []),
    ([{"name": "cache", "emptyDir": {}}], [{"name": "cache", "mountPath": "/cache"}]),
    (
        [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        [{"name": "shm", "mountPath": "/dev/shm"}],
    ),
    ([{"name": "cfg", "configMap": {"name": "engine-config"}}], []),
    (
        [{"name": "models", "hostPath": {"path": "/data/models"}}],
        [{"name": "models", "mountPath": "/models", "readOnly": True}],
    ),
    # Named like the operator's /dev/shm volume: the user's replaces ours, our mount uses it.
    ([{"name": "pd-shm", "emptyDir": {"medium": "Memory"}}], []),
]

# --- the schema, and paths into documents -----------------------------------------------------

SchemaPath = tuple[str, ...]  # property names, "[]" for list items, "{}" for map values


@functools.cache
def spec_schema() -> dict[str, Any]:
    crd = build_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]  # type: ignore[no-any-return]


def _schema_nodes(
    node: dict[str, Any], path: SchemaPath = ()
) -> Iterator[tuple[SchemaPath, dict[str, Any]]]:
    yield path, node
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return
    for name, child in (node.get("properties") or {}).items():
        yield from _schema_nodes(child, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from _schema_nodes(node["items"], (*path, "[]"))
    if isinstance(node.get("additionalProperties"), dict):
        yield from _schema_nodes(node["additionalProperties"], (*path, "{}"))


@functools.cache
def schema_nodes() -> list[tuple[SchemaPath, dict[str, Any]]]:
    """Every node of the spec schema below the root."""
    return [(p, n) for p, n in _schema_nodes(spec_schema()) if p]


Concrete = list[str | int]


def _resolve(doc: dict[str, Any], path: SchemaPath, rng: random.Random) -> Concrete | None:
    """A concrete path in `doc["spec"]` for a schema path: list indexes and map keys chosen from
    what the document has. Missing objects on the way are created later; missing lists and maps
    make the path unusable (None)."""
    node: Any = doc["spec"]
    concrete: Concrete = []
    for position, part in enumerate(path):
        last = position == len(path) - 1
        if part == "[]":
            if not isinstance(node, list) or not node:
                return None
            index = rng.randrange(len(node))
            concrete.append(index)
            node = node[index]
        elif part == "{}":
            if not isinstance(node, dict) or not node:
                return None
            key = rng.choice(sorted(node))
            concrete.append(key)
            node = node[key]
        else:
            if node is None:
                node = {}
            if not isinstance(node, dict):
                return None
            concrete.append(part)
            node = node.get(part)
            if node is None and not last and path[position + 1] in ("[]", "{}"):
                return None
    return concrete


def _dotted(concrete: Concrete) -> str:
    out = "spec"
    for part in concrete:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _put(doc: dict[str, Any], concrete: Concrete, value: Any) -> None:
    node: Any = doc["spec"]
    for part in concrete[:-1]:
        if isinstance(part, int):
            node = node[part]
        else:
            if not isinstance(node.get(part), dict | list):
                node[part] = {}
            node = node[part]
    node[concrete[-1]] = value


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 90 else f"{text[:60]}...({len(text)} chars)"


def _node_values(path: SchemaPath, node: dict[str, Any], valid: bool) -> list[Any]:
    name = path[-1] if path[-1] not in ("[]", "{}") else path[-2] + path[-1]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        values = PASSTHROUGH.get(name) or PASSTHROUGH.get(path[-2] + "[]", [])
        return values if valid else ["x", 1]
    kind = node.get("type")
    if kind == "array":
        items = node["items"]
        top = node.get("maxItems", 8)
        if items.get("type") not in ("string", "integer", "boolean"):
            return [[]] if valid else [[], {}]
        pool = scalar_values(items, True)
        if valid:
            return [[], [pool[0]], pool[: max(1, min(top, len(pool)))]]
        bad = scalar_values(items, False)
        return [[bad[0]], [pool[0]] * (top + 1), [pool[0], pool[0]], "x"]
    if kind == "object" and "additionalProperties" in node:
        values_node = node["additionalProperties"]
        key_pattern = next(
            (r["rule"].split("matches(r'")[1].split("')")[0] for r in _rules(node)), None
        )
        keys_good, keys_bad = PATTERN_VALUES.get(key_pattern or "", (["k"], ["bad key!"]))
        top = node.get("maxProperties", 8)
        good_values = scalar_values(values_node, True)
        if valid:
            return [{}, {keys_good[0]: good_values[0]}, {k: good_values[-1] for k in keys_good}]
        bad_values = scalar_values(values_node, False)
        return [
            {keys_bad[0]: good_values[0]},
            {keys_good[0]: bad_values[0]},
            {f"k{i}": good_values[0] for i in range(top + 1)},
        ]
    if kind == "object":
        return [{}] if valid else [{"bogus": 1}, [], "x"]
    return scalar_values(node, valid)


# --- mutations --------------------------------------------------------------------------------

Mutation = Callable[[random.Random, dict[str, Any], bool], str | None]


def leaf(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Any field of the schema set to a value drawn from its type, bounds and pattern."""
    path, node = rng.choice(schema_nodes())
    concrete = _resolve(doc, path, rng)
    if concrete is None:
        return None
    values = _node_values(path, node, valid)
    if not values:
        return None
    value = copy.deepcopy(rng.choice(values))
    _put(doc, concrete, value)
    return f"{_dotted(concrete)} = {_short(value)}"


def _typed_objects(doc: dict[str, Any]) -> list[tuple[Concrete, dict[str, Any]]]:
    """Concrete paths of the document's objects whose schema lists their fields."""
    found: list[tuple[Concrete, dict[str, Any]]] = []

    def walk(value: Any, node: dict[str, Any], concrete: Concrete) -> None:
        if isinstance(value, dict) and "properties" in node:
            if not node.get("x-kubernetes-preserve-unknown-fields"):
                found.append((concrete, value))
            for name, child in node["properties"].items():
                if name in value:
                    walk(value[name], child, [*concrete, name])
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for index, item in enumerate(value):
                walk(item, node["items"], [*concrete, index])

    walk(doc["spec"], spec_schema(), [])
    return found


def unknown_field(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """A field no schema knows, in an object whose fields are known: refused by both."""
    concrete, obj = rng.choice(_typed_objects(doc))
    name = rng.choice(["bogus", "gpus", "replica", "Image", "engine_args"])
    obj[name] = rng.choice([1, "x", {}])
    return f"{_dotted([*concrete, name])} = {_short(obj[name])} (unknown field)"


def remove_field(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """A field of the document removed: its default, or refused when required."""
    concrete, obj = rng.choice(_typed_objects(doc))
    if not obj:
        return None
    name = rng.choice(sorted(obj))
    del obj[name]
    return f"del {_dotted([*concrete, name])}"


def _pools(doc: dict[str, Any], role: str) -> Any:
    role_spec = doc["spec"].get(role)
    return role_spec.get("pools") if isinstance(role_spec, dict) else None


def _pool(rng: random.Random, doc: dict[str, Any]) -> tuple[str, int, dict[str, Any]] | None:
    role = rng.choice(["prefill", "decode"])
    pools = _pools(doc, role)
    if not isinstance(pools, list) or not pools or not isinstance(pools[0], dict):
        return None
    index = rng.randrange(len(pools))
    pool = pools[index]
    return (role, index, pool) if isinstance(pool, dict) else None


def _where(role: str, index: int, rest: str = "") -> str:
    return f"spec.{role}.pools[{index}]{rest}"


REPLICA_BOUNDS_VALID = [(0, 1), (1, 1), (2, 2), (1, 1000), (0, 5), (3, 10), (1, 2.0)]
REPLICA_BOUNDS_INVALID = [(5, 2), (0, 0), (0, 1001), (1.0, 2), ("1", 2), (-1, 2), (1, "2")]


def replica_bounds(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Replica bounds of a pool, whole and partial (the other bound defaulted)."""
    picked = _pool(rng, doc)
    if picked is None:
        return None
    role, index, pool = picked
    low, high = rng.choice(REPLICA_BOUNDS_VALID if valid else REPLICA_BOUNDS_INVALID)
    bounds = rng.choice([{"min": low, "max": high}, {"min": low}, {"max": high}])
    pool["replicas"] = bounds
    return f"{_where(role, index, '.replicas')} = {_short(bounds)}"


def _pool_name(rng: random.Random) -> str:
    words = [rng.choice(POOL_WORDS) for _ in range(rng.randint(1, 2))]
    return "-".join(words)[:32].strip("-") or "p"


def pool_name(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """A pool renamed, to words that make child names read two ways, or to invalid names."""
    picked = _pool(rng, doc)
    if picked is None:
        return None
    role, index, pool = picked
    pool["name"] = _pool_name(rng) if valid else rng.choice(INVALID_POOL_NAMES)
    return f"{_where(role, index, '.name')} = {_short(pool['name'])}"


def add_pool(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Another pool in a role: a copy under a new name, the same name, or far too many."""
    picked = _pool(rng, doc)
    if picked is None:
        return None
    role, index, pool = picked
    pools = doc["spec"][role]["pools"]
    if valid:
        extra = copy.deepcopy(pool)
        extra["name"] = _pool_name(rng)
        pools.append(extra)
        return f"spec.{role}.pools += copy of [{index}] named {extra['name']!r}"
    choice = rng.randrange(3)
    if choice == 0:
        pools.append(copy.deepcopy(pool))
        return f"spec.{role}.pools += duplicate of [{index}]"
    if choice == 1:
        doc["spec"][role]["pools"] = []
        return f"spec.{role}.pools = []"
    doc["spec"][role]["pools"] = [{**copy.deepcopy(pool), "name": f"p{i}"} for i in range(9)]
    return f"spec.{role}.pools = 9 pools"


TOLERATIONS_VALID: list[dict[str, Any]] = [
    {"operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "k", "value": "v", "effect": "PreferNoSchedule"},
    {"key": "k", "operator": "Equal", "value": ""},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "tolerationSeconds": 30},
    {"key": "", "operator": "Exists"},
]
TOLERATIONS_INVALID: list[dict[str, Any]] = [
    {"key": "k", "operator": "In"},
    {"key": "k", "effect": "NoRun"},
    {"key": "k", "tolerationSeconds": -1, "effect": "NoExecute"},
    {"key": "k", "value": "x" * 64},
    {"key": "k", "tolerationSeconds": 1.5, "effect": "NoExecute"},
    {"key": "k", "operator": "exists"},
]
# Shapes the models admit and the core/v1 Toleration validation may not: found by this test.
TOLERATIONS_SUSPECT: list[dict[str, Any]] = [
    {"key": "", "operator": "Equal", "value": "v"},
    {"operator": "Equal"},
    {"key": "k", "operator": "Exists", "value": "v"},
    {"key": "k", "tolerationSeconds": 30},
    {"key": "bad key!", "operator": "Exists"},
    {"key": "k", "value": "bad value!"},
    {"key": "k", "effect": "NoExecute", "tolerationSeconds": 2**64},
]


def tolerations(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """A pool's tolerations: the core/v1 shapes, right and wrong."""
    picked = _pool(rng, doc)
    if picked is None:
        return None
    role, index, pool = picked
    if valid:
        source = TOLERATIONS_VALID + TOLERATIONS_SUSPECT * (rng.random() < 0.3)
    else:
        source = TOLERATIONS_INVALID
    value = [copy.deepcopy(rng.choice(source)) for _ in range(rng.randint(1, 3))]
    if not valid and rng.random() < 0.2:
        value = [{"operator": "Exists"}] * 17
    accelerator = pool.setdefault("accelerator", {})
    if not isinstance(accelerator, dict):
        return None
    accelerator["tolerations"] = value
    return f"{_where(role, index, '.accelerator.tolerations')} = {_short(value)}"


def _template(rng: random.Random, doc: dict[str, Any]) -> tuple[str, dict[str, Any], bool] | None:
    """A pool's template, or the router's: (where, template, is_router)."""
    if rng.random() < 0.3:
        router = doc["spec"].setdefault("router", {})
        if not isinstance(router, dict):
            return None
        template = router.setdefault("template", {})
        where, is_router = "spec.router.template", True
    else:
        picked = _pool(rng, doc)
        if picked is None:
            return None
        role, index, pool = picked
        template = pool.setdefault("template", {})
        where, is_router = _where(role, index, ".template"), False
    return (where, template, is_router) if isinstance(template, dict) else None


ENV_VALID: list[list[dict[str, Any]]] = [
    [{"name": "X", "value": ""}],
    [{"name": "X"}],
    [{"name": "HF_HOME", "value": "/models"}, {"name": "A.B-c", "value": "模型"}],
    [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],  # may replace one the operator sets
    [{"name": "MC_FORCE_TCP", "value": "0"}],
    [{"name": "X", "value": "1"}, {"name": "X", "value": "2"}],  # twice: valid for core/v1
]
ENV_INVALID: list[Any] = [
    [{"name": "1X", "value": "a"}],
    [{"name": "A=B"}],
    [{"value": "v"}],
    [{"name": "X", "value": 1}],
    [{"name": "X", "value": "v" * 4097}],
    [{"name": f"X{i}"} for i in range(65)],
    {"X": "1"},
]


def env(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Extra environment variables of a pool or the router."""
    picked = _template(rng, doc)
    if picked is None:
        return None
    where, template, _ = picked
    template["env"] = copy.deepcopy(rng.choice(ENV_VALID if valid else ENV_INVALID))
    return f"{where}.env = {_short(template['env'])}"


def _amounts(rng: random.Random, values: list[str]) -> dict[str, str]:
    return {k: rng.choice(values) for k in rng.sample(["cpu", "memory"], rng.randint(1, 2))}


RESOURCES_VALID: list[dict[str, Any]] = [
    {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "128Gi"}},
    {"requests": {"cpu": "500m"}},
    {"limits": {"cpu": "2", "memory": "4Gi"}},
    {"requests": {}, "limits": {}},
    {},
]
# Requests over limits: the schema cannot compare two quantities.
RESOURCES_SUSPECT: list[dict[str, Any]] = [
    {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}},
    {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}},
]


def resources(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """CPU and memory of a pool's engine or the router: quantities in every spelling."""
    picked = _template(rng, doc)
    if picked is None:
        return None
    where, template, _ = picked
    if valid:
        choice = rng.random()
        if choice < 0.5:
            value = copy.deepcopy(rng.choice(RESOURCES_VALID))
        elif choice < 0.85:
            amounts = QUANTITIES_VALID + QUANTITIES_ODD
            value = {"requests": _amounts(rng, amounts)}
            if rng.random() < 0.5:
                value["limits"] = {
                    k: "9999Gi" if k == "memory" else "9999" for k in value["requests"]
                }
        else:
            value = copy.deepcopy(rng.choice(RESOURCES_SUSPECT))
    else:
        value = rng.choice(
            [
                {"requests": _amounts(rng, QUANTITIES_INVALID)},
                {"limits": {"gpu": "1"}},
                {"requests": {"cpu": 1}},
                {"requests": "1"},
            ]
        )
    template["resources"] = value
    return f"{where}.resources = {_short(value)}"


def quantity_field(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """A pool's shmSize, in every spelling of a quantity."""
    picked = _pool(rng, doc)
    if picked is None:
        return None
    role, index, pool = picked
    template = pool.setdefault("template", {})
    if not isinstance(template, dict):
        return None
    template["shmSize"] = rng.choice(
        QUANTITIES_VALID + QUANTITIES_ODD if valid else QUANTITIES_INVALID
    )
    return f"{_where(role, index, '.template.shmSize')} = {_short(template['shmSize'])}"


# Strings the models take for fields a pod spec checks itself (names, images).
POD_STRINGS_VALID = ["default-scheduler", "pd-mock-scheduler", "high-priority", "a.b-c", ""]
POD_STRINGS_SUSPECT = ["Bad Name", "under_score", "x" * 254, " leading", "UPPER"]
IMAGES_VALID = ["img:1", "registry.example.com:5000/a/b@sha256:" + "a" * 64, "vllm/vllm-openai"]
IMAGES_SUSPECT = [" img:1", "img:1 ", "img 1", "img:1\n"]


def template_strings(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Image, scheduler, priority class and service account names of a pool or the router."""
    picked = _template(rng, doc)
    if picked is None:
        return None
    where, template, _ = picked
    name = rng.choice(["image", "schedulerName", "priorityClassName", "serviceAccountName"])
    pool: list[Any]
    if name == "image":
        pool = IMAGES_VALID + IMAGES_SUSPECT * (rng.random() < 0.3) if valid else ["", 1]
    else:
        pool = POD_STRINGS_VALID + POD_STRINGS_SUSPECT * (rng.random() < 0.3) if valid else [1]
    template[name] = rng.choice(pool)
    return f"{where}.{name} = {_short(template[name])}"


LABEL_KEYS_SUSPECT = ["example.com/" + "n" * 64, "a" * 64, "kubernetes.io/x", "Example/x"]
LABEL_VALUES_SUSPECT = ["bad value!", "-a", "a-", "a b", "模型"]


def label_maps(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Pod labels, annotations and node selectors: keys and values of every shape."""
    if rng.random() < 0.4:
        picked = _pool(rng, doc)
        if picked is None:
            return None
        role, index, pool = picked
        target = pool.setdefault("accelerator", {})
        where, name = _where(role, index, ".accelerator"), "nodeSelector"
    else:
        found = _template(rng, doc)
        if found is None:
            return None
        where, target, _ = found
        name = rng.choice(["labels", "annotations"])
    if not isinstance(target, dict):
        return None
    value: Any
    if valid:
        keys = QUALIFIED_VALID + LABEL_KEYS_SUSPECT * (rng.random() < 0.2)
        values = LABEL_VALUES_VALID + LABEL_VALUES_SUSPECT * (rng.random() < 0.2)
        if name == "annotations":
            values = [*LABEL_VALUES_VALID, 'any text: {"json": true}', "v" * 4096]
        value = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(1, 3))}
        if rng.random() < 0.1:  # the operator's own keys: ours must win, the pod stays valid
            value["pdoperator.io/role"] = "router"
    else:
        value = rng.choice(
            [
                {rng.choice(QUALIFIED_INVALID): "a"},
                {"k": rng.choice(LABEL_VALUES_INVALID)},
                {f"k{i}": "v" for i in range(33)},
                ["k=v"],
            ]
        )
    target[name] = value
    return f"{where}.{name} = {_short(value)}"


def passthrough(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Affinity, security contexts, spread constraints, volumes: valid core/v1 values only."""
    picked = _template(rng, doc)
    if picked is None:
        return None
    where, template, _ = picked
    name = rng.choice(["affinity", "securityContext", "containerSecurityContext", "spread", "vol"])
    if name == "vol":
        volumes, mounts = copy.deepcopy(rng.choice(VOLUME_SETS))
        template["volumes"], template["volumeMounts"] = volumes, mounts
        return f"{where}.volumes = {_short(volumes)}, volumeMounts = {_short(mounts)}"
    if name == "spread":
        value: Any = [copy.deepcopy(rng.choice(PASSTHROUGH["topologySpreadConstraints[]"]))]
        name = "topologySpreadConstraints"
    else:
        value = copy.deepcopy(rng.choice(PASSTHROUGH[name]))
    template[name] = value
    return f"{where}.{name} = {_short(value)}"


def _floors(rng: random.Random, doc: dict[str, Any], role: str, valid: bool) -> dict[str, Any]:
    found = _pools(doc, role)
    pools = [p for p in found if isinstance(p, dict)] if isinstance(found, list) else []
    if not pools:
        return {}
    pool = rng.choice(pools)
    name = pool.get("name", "p")
    bounds = pool.get("replicas")
    high = bounds.get("max", 10) if isinstance(bounds, dict) else 10
    high = high if isinstance(high, int) and not isinstance(high, bool) else 10
    if valid:
        return {name: rng.choice([0, 1, max(0, min(high, 1000))])}
    return rng.choice(
        [{name: high + 1}, {"nosuchpool": 1}, {name: 1.0}, {name: -1}, {name: "1"}, {"P": 1}]
    )


def schedules(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Scheduled floors: pools by name, times, days, zones; some right, some not."""
    scaling = doc["spec"].setdefault("scaling", {})
    if not isinstance(scaling, dict):
        return None
    items = []
    for number in range(rng.randint(1, 2)):
        item: dict[str, Any] = {
            "name": f"s{number}",
            "start": rng.choice(CLOCK_VALID),
            "end": rng.choice(CLOCK_VALID),
        }
        for role in rng.sample(["prefill", "decode"], rng.randint(1, 2)):
            item[role] = _floors(rng, doc, role, True)
        if rng.random() < 0.4:
            item["timeZone"] = rng.choice(TIME_ZONES_VALID)
        if rng.random() < 0.3:
            item["days"] = rng.sample(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], 2)
        if rng.random() < 0.2:
            item["leadSeconds"] = rng.choice([0, 600, 86400])
        items.append(item)
    if not valid:
        item = items[0]
        broken = rng.randrange(8)
        if broken == 0:
            items.append(copy.deepcopy(item))  # the same name twice
        elif broken == 1:
            item["timeZone"] = rng.choice(TIME_ZONES_UNKNOWN + TIME_ZONES_INVALID)
        elif broken == 2:
            item[rng.choice(["start", "end"])] = rng.choice(CLOCK_INVALID)
        elif broken == 3:
            item["days"] = rng.choice([[], ["Monday"], ["Mon", "Mon"], ["mon"]])
        elif broken == 4:
            item.pop("prefill", None)
            item.pop("decode", None)
        elif broken == 5:
            items[:] = [{**item, "name": f"s{i}"} for i in range(17)]
        else:
            role = rng.choice(["prefill", "decode"])
            item[role] = _floors(rng, doc, role, False)
    scaling["schedules"] = items
    return f"spec.scaling.schedules = {_short(items)}"


def seasonal(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Seasonal pre-warming: period, seasons and time zone."""
    scaling = doc["spec"].setdefault("scaling", {})
    if not isinstance(scaling, dict):
        return None
    value: dict[str, Any] = {}
    if rng.random() < 0.6:
        value["period"] = rng.choice(["Day", "Week"] if valid else ["day", "Month", ""])
    if rng.random() < 0.6:
        value["seasons"] = rng.choice([1, 3, 8, 2.0] if valid else [0, 9, 1.5, "3"])
    if rng.random() < 0.6 or not valid:
        zones = TIME_ZONES_VALID if valid else TIME_ZONES_UNKNOWN + TIME_ZONES_INVALID
        value["timeZone"] = rng.choice(zones)
    scaling["seasonal"] = value
    return f"spec.scaling.seasonal = {_short(value)}"


SCALE_DOWN = [
    ({"stabilizationSeconds": 30, "maxStepReplicas": 1}, True),
    ({"stabilizationSeconds": 0, "maxStepReplicas": 1}, True),
    ({"stabilizationSeconds": 600, "maxStepReplicas": 2, "steadyStabilizationSeconds": 600}, True),
    ({"stabilizationSeconds": 300, "maxStepReplicas": 1, "steadyStabilizationSeconds": 0}, True),
    ({"stabilizationSeconds": 300, "maxStepReplicas": 1.0}, True),
    ({"stabilizationSeconds": 30, "maxStepReplicas": 1, "steadyStabilizationSeconds": 60}, False),
    ({"stabilizationSeconds": 300.0, "maxStepReplicas": 1}, False),
    ({"stabilizationSeconds": 300, "maxStepReplicas": 1, "steadyStabilizationSeconds": 6.0}, False),
    ({"stabilizationSeconds": 300}, False),
    ({"stabilizationSeconds": 86401, "maxStepReplicas": 1}, False),
]


def scale_steps(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Scale-up and scale-down policies, the steady window against the long one."""
    scaling = doc["spec"].setdefault("scaling", {})
    if not isinstance(scaling, dict):
        return None
    if rng.random() < 0.6:
        value = copy.deepcopy(rng.choice([v for v, ok in SCALE_DOWN if ok == valid]))
        scaling["scaleDown"] = value
        return f"spec.scaling.scaleDown = {_short(value)}"
    up = [
        {"stabilizationSeconds": 0, "maxStepReplicas": 100},
        {"stabilizationSeconds": 60.0, "maxStepReplicas": 1},
    ]
    bad = [{"stabilizationSeconds": 0, "maxStepReplicas": 0}, {"maxStepReplicas": 1}]
    scaling["scaleUp"] = copy.deepcopy(rng.choice(up if valid else bad))
    return f"spec.scaling.scaleUp = {_short(scaling['scaleUp'])}"


def ratio(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """The prefill-to-decode ratio guardrail."""
    scaling = doc["spec"].setdefault("scaling", {})
    if not isinstance(scaling, dict):
        return None
    good = [(100, 400), (1, 10000), (50, 50)]
    bad = [(300, 100), (0, 100), (1.5, 100), (100, 200.0), (100, 10001), ("100", 200)]
    low, high = rng.choice(good if valid else bad)
    scaling["prefillToDecodeRatio"] = {"minPercent": low, "maxPercent": high}
    return f"spec.scaling.prefillToDecodeRatio = {_short(scaling['prefillToDecodeRatio'])}"


def prometheus(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Where metrics come from, with secret references."""
    scaling = doc["spec"].setdefault("scaling", {})
    if not isinstance(scaling, dict):
        return None
    value: dict[str, Any] = {"url": rng.choice(PATTERN_VALUES[r"^https?://"][0 if valid else 1])}
    if rng.random() < 0.5:
        ref = {"name": "prom", "key": "token"} if valid else rng.choice([{"name": "prom"}, {}])
        value[rng.choice(["bearerTokenSecretRef", "caSecretRef"])] = ref
    scaling["prometheus"] = value
    return f"spec.scaling.prometheus = {_short(value)}"


def router(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """The router: on or off, fixed or autoscaled replicas, what its template may not set."""
    spec_router = doc["spec"].setdefault("router", {})
    if not isinstance(spec_router, dict):
        return None
    choice = rng.randrange(4)
    if choice == 0:
        spec_router["enabled"] = rng.choice([True, False] if valid else ["true", 1, "false"])
        return f"spec.router.enabled = {_short(spec_router['enabled'])}"
    if choice == 1:
        good = [(1, 1), (1, 3), (2, 2), (1, 100)]
        bad = [(3, 2), (0, 1), (1, 101), (1, 2.0), (1.0, 1)]
        low, high = rng.choice(good if valid else bad)
        spec_router["replicas"] = {"min": low, "max": high}
        return f"spec.router.replicas = {_short(spec_router['replicas'])}"
    if choice == 2:
        template = spec_router.setdefault("template", {})
        if not isinstance(template, dict):
            return None
        name = (
            "imagePullSecrets"
            if valid
            else rng.choice(["serviceAccountName", "shmSize", "automountServiceAccountToken"])
        )
        template[name] = {
            "imagePullSecrets": ["regcred", "other"],
            "serviceAccountName": "admin",
            "shmSize": "1Gi",
            "automountServiceAccountToken": True,
        }[name]
        return f"spec.router.template.{name} = {_short(template[name])}"
    args = [["--request-timeout-secs", "600"], [], ["--x"] * 32] if valid else [["--x"] * 33, [1]]
    spec_router["args"] = rng.choice(args)
    return f"spec.router.args = {_short(spec_router['args'])}"


RESOURCE_NAMES_VALID = ["nvidia.com/gpu", "mthreads.com/gpu", "amd.com/gpu", "example.com/x_y.z"]
# Qualified names that a container's resources may still refuse (no domain, the kubernetes.io
# domain, a name part over 63 characters) or that collide with cpu and memory.
RESOURCE_NAMES_SUSPECT = ["gpu", "kubernetes.io/gpu", "cpu", "memory", "example.com/" + "g" * 64]


def accelerator(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """A pool's accelerator resource and cards per replica."""
    picked = _pool(rng, doc)
    if picked is None:
        return None
    role, index, pool = picked
    target = pool.setdefault("accelerator", {})
    if not isinstance(target, dict):
        return None
    if rng.random() < 0.6:
        names = RESOURCE_NAMES_VALID + RESOURCE_NAMES_SUSPECT * (rng.random() < 0.3)
        target["resourceName"] = rng.choice(names if valid else QUALIFIED_INVALID)
        return (
            f"{_where(role, index, '.accelerator.resourceName')} = {_short(target['resourceName'])}"
        )
    target["perReplica"] = rng.choice([1, 8, 64, 4.0] if valid else [0, 65, 1.5, "8"])
    return f"{_where(role, index, '.accelerator.perReplica')} = {_short(target['perReplica'])}"


def metadata_name(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """The PDDeployment's own name: long ones (children's names cut and hashed), invalid ones."""
    if valid:
        head = "-".join(rng.choice(NAME_WORDS) for _ in range(rng.randint(1, 3)))
        doc["metadata"]["name"] = (head + "-" + "n" * 63)[: rng.choice([62, 63])].strip("-")
    else:
        doc["metadata"]["name"] = rng.choice(INVALID_NAMES)
    return f"metadata.name = {_short(doc['metadata']['name'])}"


def metadata_extras(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """Labels and annotations of the PDDeployment itself: children never copy them."""
    name = rng.choice(["labels", "annotations"])
    doc["metadata"][name] = {"app.kubernetes.io/instance": "gitops", "team": "llm"}
    return f"metadata.{name} = {_short(doc['metadata'][name])}"


def null_field(rng: random.Random, doc: dict[str, Any], valid: bool) -> str | None:
    """A field set to null (YAML's `key:` with nothing after it): the apiserver drops it before
    defaulting and validation, so the models must read it as absent too. The only source of
    nulls in the generated documents."""
    concrete, obj = rng.choice(_typed_objects(doc))
    if not obj:
        return None
    name = rng.choice(sorted(obj))
    obj[name] = None
    return f"{_dotted([*concrete, name])} = null"


# (mutation, weight)
MUTATIONS: list[tuple[Mutation, int]] = [
    (leaf, 30),
    (unknown_field, 3),
    (remove_field, 4),
    (null_field, 2),
    (replica_bounds, 6),
    (pool_name, 6),
    (add_pool, 4),
    (tolerations, 5),
    (env, 4),
    (resources, 5),
    (quantity_field, 3),
    (template_strings, 4),
    (label_maps, 5),
    (passthrough, 5),
    (schedules, 6),
    (seasonal, 3),
    (scale_steps, 3),
    (ratio, 2),
    (prometheus, 2),
    (router, 5),
    (accelerator, 4),
    (metadata_name, 3),
    (metadata_extras, 1),
]


def bases() -> list[tuple[str, dict[str, Any]]]:
    """The valid documents that mutations start from."""
    return [("minimal", minimal()), *((path.stem, load_sample(path)) for path in SAMPLES)]


def _name(rng: random.Random) -> str:
    return "-".join(rng.choice(NAME_WORDS) for _ in range(rng.randint(1, 3)))


Naming = tuple[str, str, str]  # (metadata.name, role, name of the role's first pool)


def twins(rng: random.Random) -> tuple[Naming, Naming]:
    """Two PDDeployments whose children's readable names are the same: the naming scheme must
    still give them different names."""
    name, role = _name(rng), rng.choice(["prefill", "decode"])
    word, rest = rng.choice(POOL_WORDS), rng.choice(POOL_WORDS)
    kind = rng.randrange(4)
    if kind == 0:  # `a` with pool `w-x` and `a-prefill-w` with pool `x`: a-prefill-w-x
        return (name, role, f"{word}-{rest}"), (f"{name}-{role}-{word}", role, rest)
    if kind == 1:  # `1a` and `pd-1a`: both Services are pd-1a-<role>
        digit = rng.choice(["1", "2a", "9-x"])
        return (digit, role, rest), (f"pd-{digit}", role, rest)
    if kind == 2:  # `a` and `a-prefill`: a's role Service is a-prefill, the other's endpoint
        return (name, role, rest), (f"{name}-{role}", role, rest)
    # 63 characters alike up to where child names are cut for their hash
    head = (name + "-" + "n" * 63)[:55]
    return (head + "-" + "a" * 7, role, rest), (head + "-" + "b" * 7, role, rest)


TWIN_SHARE = 0.15


def _rename(case: Case, naming: Naming, note: str) -> None:
    name, role, pool = naming
    case.document["metadata"]["name"] = name
    case.document["spec"][role]["pools"][0]["name"] = pool
    case.mutations.append(f"metadata.name = {name!r}, {_where(role, 0, '.name')} = {pool!r}{note}")


def generate(seed: int, count: int) -> list[Case]:
    """`count` documents, the same ones for the same seed."""
    rng = random.Random(seed)
    starts = bases()
    functions, weights = zip(*MUTATIONS, strict=True)
    cases = []
    pending: Naming | None = None
    for index in range(count):
        base, document = rng.choice(starts)
        case = Case(index, base, document=copy.deepcopy(document))
        wanted = rng.randint(*MUTATIONS_PER_DOCUMENT)
        if pending is not None:
            _rename(case, pending, f" (twin of #{index - 1})")
            pending, wanted = None, wanted - 1
        elif index + 1 < count and rng.random() < TWIN_SHARE:
            first, pending = twins(rng)
            _rename(case, first, f" (twin of #{index + 1})")
            wanted -= 1
        else:
            case.document["metadata"]["name"] = _name(rng)
            case.mutations.append(f"metadata.name = {case.document['metadata']['name']!r}")
            if rng.random() < 0.3:  # pools named to collide with other objects' children
                for role in ("prefill", "decode"):
                    pool = case.document["spec"][role]["pools"][0]
                    pool["name"] = _pool_name(rng)
                    case.mutations.append(f"{_where(role, 0, '.name')} = {pool['name']!r}")
        made = 0
        while made < wanted:
            mutation = rng.choices(functions, weights)[0]
            valid = rng.random() < VALID_SHARE
            described = mutation(rng, case.document, valid)
            if described is not None:
                case.mutations.append(described)
                made += 1
        cases.append(case)
    return cases
