"""Cluster profiles: the nodes a simulated (or kind) cluster has, as a small YAML document.

```yaml
name: articles
nodeGroups:
- name: s5000                 # DNS label; nodes are named <namePrefix><index>
  count: 4
  instanceType: s5000-8x      # node.kubernetes.io/instance-type (default: the group name)
  cpu: "192"
  memory: 2Ti
  labels: {mthreads.com/gpu.product: MTT-S5000}
  taints: [{key: mthreads.com/gpu, effect: NoSchedule}]
  accelerators:
  - {resourceName: mthreads.com/gpu, perNode: 8, profile: mtt-s5000}
```

`profile` names a card in `pd_operator.core.hardware.HARDWARE_PROFILES`; the virtual kubelet
takes model-load times from it. Documented in docs/mock-scheduler.md.
"""

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from pd_operator.api.document import describe_errors, read_yaml
from pd_operator.api.types import (
    DNS_LABEL_PATTERN,
    WHOLE_NUMBER,
    LabelKey,
    LabelValue,
    Quantity,
)
from pd_operator.core.hardware import HARDWARE_PROFILES, HardwareProfile

# Node names are DNS subdomains of at most 253 characters; a prefix leaves room for the index.
NAME_PREFIX_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[-a-z0-9])?$"
MAX_NODES = 10_000


class ProfileModel(BaseModel):
    """camelCase on the wire, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Accelerator(ProfileModel):
    """Cards of one kind on every node of a group, advertised as an extended resource."""

    resource_name: Annotated[LabelKey, Field(max_length=253)]
    per_node: Annotated[int, Field(ge=1, le=64), WHOLE_NUMBER]
    profile: StrictStr

    @field_validator("resource_name")
    @classmethod
    def _extended(cls, value: str) -> str:
        # Extended resources must be domain-qualified and outside kubernetes.io.
        domain = value.partition("/")[0] if "/" in value else ""
        if not domain or domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
            raise ValueError(f"{value!r} is not an extended resource name (domain/name)")
        return value

    @field_validator("profile")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in HARDWARE_PROFILES:
            raise ValueError(
                f"unknown hardware profile {value!r}; known: {sorted(HARDWARE_PROFILES)}"
            )
        return value

    @property
    def hardware(self) -> HardwareProfile:
        """The card's hardware profile."""
        return HARDWARE_PROFILES[self.profile]


class Taint(ProfileModel):
    """A node taint (core/v1 shape)."""

    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeGroup(ProfileModel):
    """`count` identical nodes."""

    name: Annotated[StrictStr, Field(min_length=1, max_length=40, pattern=DNS_LABEL_PATTERN)]
    count: Annotated[int, Field(ge=0, le=MAX_NODES), WHOLE_NUMBER]
    name_prefix: (
        Annotated[StrictStr, Field(min_length=1, max_length=200, pattern=NAME_PREFIX_PATTERN)]
        | None
    ) = None
    instance_type: LabelValue | None = None
    cpu: Quantity = "64"
    memory: Quantity = "512Gi"
    pods: Annotated[int, Field(ge=1, le=1000), WHOLE_NUMBER] = 110
    labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=32)] = Field(
        default_factory=dict
    )
    taints: Annotated[list[Taint], Field(max_length=16)] = Field(default_factory=list)
    accelerators: Annotated[list[Accelerator], Field(max_length=8)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct_resources(self) -> "NodeGroup":
        names = [a.resource_name for a in self.accelerators]
        if len(names) != len(set(names)):
            raise ValueError(f"group {self.name!r} lists an accelerator resource twice")
        return self

    @property
    def prefix(self) -> str:
        """Node names of the group start with this."""
        return self.name_prefix or f"{self.name}-"

    @property
    def instance(self) -> str:
        """The node.kubernetes.io/instance-type label value."""
        return self.instance_type or self.name

    def node_name(self, index: int, prefix: str = "") -> str:
        """The name of the group's node `index`, zero-padded so names sort numerically."""
        width = len(str(max(self.count - 1, 0)))
        return f"{prefix}{self.prefix}{index:0{width}d}"

    def capacity(self) -> dict[str, str]:
        """Capacity (and allocatable) of one node, extended resources included."""
        resources = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        resources.update({a.resource_name: str(a.per_node) for a in self.accelerators})
        return resources


class ClusterProfile(ProfileModel):
    """A named set of node groups."""

    name: Annotated[StrictStr, Field(min_length=1, max_length=40, pattern=DNS_LABEL_PATTERN)]
    node_groups: Annotated[list[NodeGroup], Field(min_length=1, max_length=64)]

    @model_validator(mode="after")
    def _distinct(self) -> "ClusterProfile":
        names = [group.name for group in self.node_groups]
        if len(names) != len(set(names)):
            raise ValueError("node group names must be unique")
        prefixes = [group.prefix for group in self.node_groups]
        for a in prefixes:
            for b in prefixes:
                # "n-" and "n-1" would both name a node "n-10".
                if a != b and b.startswith(a) and b[len(a) :].isdigit():
                    raise ValueError(f"node name prefixes {a!r} and {b!r} can name the same node")
        if sum(group.count for group in self.node_groups) > MAX_NODES:
            raise ValueError(f"a profile holds at most {MAX_NODES} nodes")
        return self

    def group(self, name: str) -> NodeGroup:
        """The group called `name`; KeyError if there is none."""
        for group in self.node_groups:
            if group.name == name:
                return group
        raise KeyError(name)

    @property
    def node_count(self) -> int:
        """Nodes over all groups."""
        return sum(group.count for group in self.node_groups)


def parse_profile(document: Any) -> ClusterProfile:
    """Validate a parsed YAML/JSON document; ValueError names each bad field, one per `;`."""
    try:
        return ClusterProfile.model_validate(document)
    except ValidationError as error:
        raise ValueError("; ".join(describe_errors(error))) from None


def load_profile(path: str | Path) -> ClusterProfile:
    """Read and validate a cluster profile file."""
    return parse_profile(read_yaml(path))
