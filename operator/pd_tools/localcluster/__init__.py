"""A local control plane and Prometheus on loopback, for tests, the demo and `pdctl dev up`."""

from pd_tools.localcluster.cluster import ExistingCluster, LocalCluster
from pd_tools.localcluster.processes import LocalClusterError, MissingBinaryError, find_binary
from pd_tools.localcluster.prometheus import LocalPrometheus

__all__ = [
    "ExistingCluster",
    "LocalCluster",
    "LocalClusterError",
    "LocalPrometheus",
    "MissingBinaryError",
    "find_binary",
]
