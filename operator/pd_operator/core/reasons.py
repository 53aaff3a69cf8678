"""Every condition type and reason the operator writes, in one place (CamelCase constants)."""

# Condition types (kstatus / Argo CD read Ready, Reconciling and Stalled).
READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
PODS_SCHEDULABLE = "PodsSchedulable"

# Reasons.
AS_EXPECTED = "AsExpected"
ALL_POOLS_READY = "AllPoolsReady"
PODS_NOT_READY = "PodsNotReady"
ROLLING_OUT = "RollingOut"
APPLY_REJECTED = "ApplyRejected"
NO_NODE_FITS = "NoNodeFits"
IMAGE_UNAVAILABLE = "ImageUnavailable"
INVALID_SPEC = "InvalidSpec"
UNSCHEDULABLE = "Unschedulable"
ALL_SCHEDULED = "AllScheduled"

# Event reasons.
EVENT_STALLED = "Stalled"
EVENT_RECOVERED = "Recovered"
EVENT_DRIFT_CORRECTED = "DriftCorrected"
EVENT_POOL_DELETED = "PoolDeleted"
