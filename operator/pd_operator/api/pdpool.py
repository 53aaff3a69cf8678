"""PDPool: one role's replicas as a scale target (`/scale`) for HPA, KEDA or a GitOps tool.

In `spec.scaling.mode: External` a PDDeployment owns one PDPool per role. Whoever drives the
role's replicas writes `spec.replicas` (through `/scale`); the operator sets it only when it
creates the PDPool, and runs that many replicas within the PDDeployment's bounds, free
capacity and prefill:decode ratio. Status says what runs and selects the role's pods.
"""

from typing import Annotated

from pydantic import Field

from pd_operator.api.spec import SpecModel
from pd_operator.api.status import LimitedBy, StatusModel
from pd_operator.api.types import WHOLE_NUMBER

POOL_KIND = "PDPool"
POOL_PLURAL = "pdpools"
POOL_SHORT_NAME = "pdp"
# A role spans pools of up to 1000 replicas each; far above any real request.
MAX_REQUESTED_REPLICAS = 100_000


class PDPoolSpec(SpecModel):
    """The replicas asked for one role of a PDDeployment."""

    replicas: Annotated[int, Field(ge=0, le=MAX_REQUESTED_REPLICAS), WHOLE_NUMBER] = Field(
        description="Replicas of the role, all its pools together (the /scale subresource's "
        "spec.replicas). Set by the operator on creation only."
    )


class PDPoolStatus(StatusModel):
    """What runs for the role."""

    replicas: int = Field(0, description="Pods of the role's Deployments (the /scale status).")
    ready_replicas: int = Field(0, description="Ready pods of the role's Deployments.")
    desired_replicas: int = Field(
        0,
        description="Replicas the operator runs: spec.replicas within replicas.min/max, free "
        "capacity and prefillToDecodeRatio.",
    )
    limited_by: LimitedBy = Field("none", description="Why desiredReplicas differs from spec.")
    message: str = Field("", max_length=1024, description="The override, in words.")
    selector: str = Field(
        "", max_length=1024, description="Label selector of the role's pods (for HPA and KEDA)."
    )
