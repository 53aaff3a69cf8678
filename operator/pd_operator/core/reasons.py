"""Every condition type and reason the operator writes, in one place (CamelCase constants)."""

# Condition types (kstatus / Argo CD read Ready, Reconciling and Stalled).
READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
PODS_SCHEDULABLE = "PodsSchedulable"
SLO_MET = "SLOMet"
METRICS_AVAILABLE = "MetricsAvailable"
METRICS_CONFIGURED = "MetricsConfigured"
CAPACITY_AVAILABLE = "CapacityAvailable"
SEASONAL_HISTORY = "SeasonalHistory"
# spec.scaling.idleSeconds: every pool is at zero for lack of requests (`core.idle`).
SCALED_TO_ZERO = "ScaledToZero"
# Mode External: whether each role runs what its PDPool asks.
EXTERNAL_SCALING = "ExternalScaling"
# Whether every accelerator.profile names a known hardware profile (else: learned online).
PROFILES_KNOWN = "ProfilesKnown"

# Reasons.
AS_EXPECTED = "AsExpected"
IDLE = "Idle"  # ScaledToZero=True: no request at the router for idleSeconds
SERVING = "Serving"  # ScaledToZero=False: replicas run (or are starting for a held request)
ROUTER_TRAFFIC_UNKNOWN = "RouterTrafficUnknown"  # no activator series: idleness unknown
ALL_POOLS_READY = "AllPoolsReady"
PODS_NOT_READY = "PodsNotReady"
ROLLING_OUT = "RollingOut"
APPLY_REJECTED = "ApplyRejected"
NO_NODE_FITS = "NoNodeFits"
# A child's name is taken by an object this PDDeployment does not own.
NAME_CONFLICT = "NameConflict"
IMAGE_UNAVAILABLE = "ImageUnavailable"
# A rollout's new revision did not become Ready within spec.rollout.progressDeadlineSeconds.
ROLLOUT_STALLED = "RolloutStalled"
# A multi-node replica has a pod on a node that is gone or not Ready (`reconcile.lost_group_nodes`).
GROUP_NODE_LOST = "GroupNodeLost"
# A Deployment's ReplicaSet cannot create pods (a missing ServiceAccount or PriorityClass, a
# Pod Security rejection, a quota): its ReplicaFailure condition, per pool.
REPLICA_FAILURE = "ReplicaFailure"
INVALID_SPEC = "InvalidSpec"
UNSCHEDULABLE = "Unschedulable"
ALL_SCHEDULED = "AllScheduled"
WITHIN_SLO = "WithinSLO"
SLO_VIOLATED = "SLOViolated"
# SLOMet=False: the TTFT breach is the KV hand-off's (spec.kvTransfer's fabric), not prefill's.
KV_TRANSFER_BOUND = "KVTransferBound"
METRICS_UNAVAILABLE = "MetricsUnavailable"
METRICS_MISCONFIGURED = "MetricsMisconfigured"
NO_READY_PODS = "NoReadyPods"
CAPACITY_EXHAUSTED = "CapacityExhausted"
HISTORY_FOUND = "HistoryFound"
HISTORY_MISSING = "HistoryMissing"
AS_REQUESTED = "AsRequested"
UNKNOWN_PROFILE = "UnknownProfile"
OVERRIDDEN = "Overridden"
PDPOOL_MISSING = "PDPoolMissing"

# Event reasons.
EVENT_STALLED = "Stalled"
EVENT_RECOVERED = "Recovered"
EVENT_DRIFT_CORRECTED = "DriftCorrected"
EVENT_POOL_DELETED = "PoolDeleted"
EVENT_SCALED_UP = "ScaledUp"
EVENT_SCALED_DOWN = "ScaledDown"
EVENT_SLO_VIOLATED = "SLOViolated"
# SLOMet=False: the TTFT breach is the KV hand-off's (spec.kvTransfer's fabric), not prefill's.
KV_TRANSFER_BOUND = "KVTransferBound"
EVENT_METRICS_UNAVAILABLE = "MetricsUnavailable"
EVENT_METRICS_MISCONFIGURED = "MetricsMisconfigured"
METRICS_MISCONFIGURED = "MetricsMisconfigured"
NO_READY_PODS = "NoReadyPods"
EVENT_CAPACITY_EXHAUSTED = "CapacityExhausted"
# Mode External: a role runs other than its PDPool asks (bounds, capacity, ratio).
EVENT_SCALE_OVERRIDDEN = "ScaleOverridden"
EVENT_UNKNOWN_PROFILE = "UnknownProfile"
