"""The PDDeployment API (pdoperator.io/v1alpha1)."""

from pd_operator.api.document import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    InvalidSpecError,
    PDDeployment,
    parse_pddeployment,
)
from pd_operator.api.spec import PDDeploymentSpec, PoolSpec, Role
from pd_operator.api.status import Condition, PDDeploymentStatus, PoolStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Condition",
    "InvalidSpecError",
    "PDDeployment",
    "PDDeploymentSpec",
    "PDDeploymentStatus",
    "PoolSpec",
    "PoolStatus",
    "Role",
    "parse_pddeployment",
]
