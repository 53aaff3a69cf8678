"""`pdctl demo`: the closed loop on one machine, with real requests through the endpoint.

A local control plane, a real Prometheus, the serving cluster (four S5000 and two H200 virtual
nodes and a CPU node for the router) with the mock scheduler, and the operator, all started
here. The virtual kubelet runs each engine pod as an engine-simulator process and the router pod
as the real `vllm-router`, each on its own loopback address. A client process sends a load with
a prefill surge and a decode step through the PDDeployment's endpoint and measures what its
users see; the table shows the pools, each role's latency against its own target and the
operator's decisions. Every process and thread started here is stopped on the way out, Ctrl-C
and SIGTERM included.
"""

from pd_tools.demo.load import TRACE
from pd_tools.demo.run import run_demo
from pd_tools.demo.settings import DemoOptions

__all__ = ["TRACE", "DemoOptions", "run_demo"]
