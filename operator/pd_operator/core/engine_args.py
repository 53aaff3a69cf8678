"""Engine command lines and environment for one role of a PDDeployment: vLLM or SGLang.

Choices, and why:

* KV roles: prefill pools are `kv_producer`, decode pools `kv_consumer`, as in vLLM's Mooncake
  guide and the multi-instance part of its NIXL guide (whose single-host example uses `kv_both`).
  Each pool serves one side only, so the role says which.
* KV-cache dtype: FP8 asks for E4M3 on both engines (vLLM's `fp8` is E4M3), so the prefill side
  produces what the decode side reads with no conversion. BF16 and Auto pass no flag: the engines'
  `auto` keeps the cache in the model's activation dtype, which is bfloat16 for the FP8 and BF16
  checkpoints this operator targets, and engine versions that lack an explicit bf16 choice still
  start. Force it with `--kv-cache-dtype` in `spec.model.args` when a model runs in fp16.
* Transport: Mooncake reads `MC_FORCE_TCP` itself whatever protocol the engine asks for, so TCP is
  set there for both engines (vLLM's connector is also told `mooncake_protocol`). NIXL moves data
  through UCX, so TCP means `UCX_TLS=^ib` (every transport but InfiniBand/RoCE verbs); RDMA keeps
  UCX's own choice.
* Connector None runs each pool as a self-contained engine (no KV hand-off): SGLang then gets no
  `--disaggregation-mode`, which would need a transfer backend.
* RDMA devices (`accelerator.rdmaDevices`, per pool: node types name their HCAs differently) go
  to Mooncake as vLLM's `kv_connector_extra_config.device_name`, a comma-separated whitelist
  (vLLM docs/features/mooncake_connector_usage.md), and SGLang's `--disaggregation-ib-device`, a
  comma-separated list (SGLang's PD disaggregation guide); to NIXL through UCX as
  `UCX_NET_DEVICES=<device>:1` (vLLM docs/features/nixl_connector_usage.md), port 1 being the
  only port of the usual one-port HCA. Only with protocol RDMA: over TCP they name nothing used.
* No Mooncake master or metadata server: both engines' PD connectors hand off peer to peer,
  through the bootstrap server of the prefill side (vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT, SGLang's
  --disaggregation-bootstrap-port); a master belongs to Mooncake Store, a KV cache store these
  pools do not use.
* NIXL's plugin (`kvTransfer.nixlBackend`) is vLLM's `kv_connector_extra_config.backends` and
  SGLang's `SGLANG_DISAGGREGATION_NIXL_BACKEND` (sglang/srt/environ.py; UCX when unset).
* Multi-node replicas (`accelerator.nodesPerReplica` > 1, a LeaderWorkerSet group) find each
  other through the environment LWS's pod webhook sets (`LWS_LEADER_ADDRESS`, the leader pod's
  DNS name; `LWS_WORKER_INDEX`, 0 on the leader), referenced as `$(VAR)`, which the kubelet
  expands in a command. vLLM runs one data-parallel rank of `perReplica` cards (its tensor-
  parallel size) per node with expert parallelism across all of them (vLLM's data-parallel
  deployment guide, without Ray): the leader serves the API, the others join `--headless` at
  start rank = worker index. SGLang spans the nodes with one tensor-parallel group of
  `perReplica x nodesPerReplica` cards (`--nnodes`, `--node-rank`, `--dist-init-addr`, as in
  LWS's SGLang example); only node rank 0 serves HTTP.
* Latency histogram bounds: the engines' own. SGLang's bounds set in `spec.model.args` are
  passed as they are and read with them (`core.histogram_bounds`); vLLM's are fixed.
"""

import json
from typing import Any

from pd_operator.api.spec import Engine, KVConnector, PDDeploymentSpec, PoolSpec, Role

HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"

_PORTS: dict[Engine, int] = {"VLLM": 8000, "SGLang": 30000}
# SGLang's decode side pulls the KV cache from the prefill pod's bootstrap server; sglang-router
# reads its port from this pod annotation (a fixed name), which prefill pods carry.
SGLANG_BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"
SGLANG_BOOTSTRAP_PORT = 8998
_VLLM_CONNECTORS: dict[KVConnector, str] = {
    "Mooncake": "MooncakeConnector",
    "NIXL": "NixlConnector",
}
_SGLANG_BACKENDS: dict[KVConnector, str] = {"Mooncake": "mooncake", "NIXL": "nixl"}
_KV_ROLES: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
# Set in every pod of a LeaderWorkerSet group by LWS's pod webhook.
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
# The leader's ports for its group: vLLM's data-parallel RPC (its documented example port) and
# SGLang's torch.distributed rendezvous (LWS's SGLang example).
VLLM_DATA_PARALLEL_RPC_PORT = 13345
SGLANG_DIST_INIT_PORT = 20000


def engine_port(engine: Engine) -> int:
    """The engine's HTTP port, which serves the API, /health and /metrics."""
    return _PORTS[engine]


def rdma_devices(spec: PDDeploymentSpec, pool: PoolSpec | None) -> list[str]:
    """The RDMA devices a pool's KV transfer is told to use; empty: the engine's own pick."""
    if pool is None or spec.kv_transfer.protocol != "RDMA":
        return []
    return list(pool.accelerator.rdma_devices)


def vllm_kv_transfer_config(
    spec: PDDeploymentSpec, role: Role, pool: PoolSpec | None = None
) -> dict[str, Any] | None:
    """vLLM's `--kv-transfer-config` for a role (and a pool's devices); None when no connector
    is configured."""
    kv = spec.kv_transfer
    if kv.connector == "None":
        return None
    config: dict[str, Any] = {
        "kv_connector": _VLLM_CONNECTORS[kv.connector],
        "kv_role": _KV_ROLES[role],
    }
    extra: dict[str, Any] = {}
    if kv.connector == "Mooncake":
        extra["mooncake_protocol"] = kv.protocol.lower()
        devices = rdma_devices(spec, pool)
        if devices:
            extra["device_name"] = ",".join(devices)
    if kv.connector == "NIXL" and kv.nixl_backend:
        extra["backends"] = [kv.nixl_backend]
    if extra:
        config["kv_connector_extra_config"] = extra
    return config


def _vllm_command(spec: PDDeploymentSpec, role: Role, pool: PoolSpec, leader: bool) -> list[str]:
    port = str(engine_port("VLLM"))
    argv = ["vllm", "serve", spec.model.name, "--port", port]
    argv += ["--tensor-parallel-size", str(pool.accelerator.per_replica)]
    nodes = pool.accelerator.nodes_per_replica
    if nodes > 1:
        argv += ["--data-parallel-size", str(nodes), "--data-parallel-size-local", "1"]
        argv += ["--data-parallel-address", LWS_LEADER_ADDRESS]
        argv += ["--data-parallel-rpc-port", str(VLLM_DATA_PARALLEL_RPC_PORT)]
        argv += ["--enable-expert-parallel"]
        if not leader:
            argv += ["--data-parallel-start-rank", LWS_WORKER_INDEX, "--headless"]
    if spec.model.context_length is not None:
        argv += ["--max-model-len", str(spec.model.context_length)]
    if spec.kv_transfer.cache_dtype == "FP8":
        argv += ["--kv-cache-dtype", "fp8"]
    config = vllm_kv_transfer_config(spec, role, pool)
    if config is not None:
        # argv goes to exec, not a shell: the JSON needs no quoting.
        argv += ["--kv-transfer-config", json.dumps(config, sort_keys=True, separators=(",", ":"))]
    return argv


def _sglang_command(spec: PDDeploymentSpec, role: Role, pool: PoolSpec) -> list[str]:
    port = str(engine_port("SGLang"))
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", spec.model.name]
    argv += ["--host", "0.0.0.0", "--port", port]
    nodes = pool.accelerator.nodes_per_replica
    argv += ["--tp-size", str(pool.accelerator.per_replica * nodes)]
    if nodes > 1:
        argv += ["--nnodes", str(nodes), "--node-rank", LWS_WORKER_INDEX]
        argv += ["--dist-init-addr", f"{LWS_LEADER_ADDRESS}:{SGLANG_DIST_INIT_PORT}"]
    # SGLang serves /metrics only when asked; the autoscaler reads TTFT and ITL from it.
    argv += ["--enable-metrics"]
    if spec.model.context_length is not None:
        argv += ["--context-length", str(spec.model.context_length)]
    if spec.kv_transfer.cache_dtype == "FP8":
        argv += ["--kv-cache-dtype", "fp8_e4m3"]
    connector = spec.kv_transfer.connector
    if connector != "None":
        argv += ["--disaggregation-mode", role]
        argv += ["--disaggregation-transfer-backend", _SGLANG_BACKENDS[connector]]
        devices = rdma_devices(spec, pool)
        if connector == "Mooncake" and devices:
            argv += ["--disaggregation-ib-device", ",".join(devices)]
        if role == "prefill":
            argv += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
    return argv


def engine_command(
    spec: PDDeploymentSpec, role: Role, pool: PoolSpec, *, leader: bool = True
) -> list[str]:
    """The engine container's full command line, with `spec.model.args` appended last;
    `leader` False: a worker pod of a multi-node replica."""
    if spec.model.engine == "VLLM":
        argv = _vllm_command(spec, role, pool, leader)
    else:
        argv = _sglang_command(spec, role, pool)
    return [*argv, *spec.model.args]


def engine_env(spec: PDDeploymentSpec, pool: PoolSpec | None = None) -> list[dict[str, Any]]:
    """Environment the KV transport needs (core/v1 EnvVar objects), the same for both roles;
    with `pool`, also its RDMA devices."""
    kv = spec.kv_transfer
    env: list[dict[str, Any]] = []
    if kv.connector == "Mooncake" and kv.protocol == "TCP":
        env.append({"name": "MC_FORCE_TCP", "value": "1"})
    if kv.connector == "NIXL":
        if kv.protocol == "TCP":
            env.append({"name": "UCX_TLS", "value": "^ib"})
        devices = rdma_devices(spec, pool)
        if devices and kv.nixl_backend in (None, "UCX"):
            value = ",".join(f"{device}:1" for device in devices)
            env.append({"name": "UCX_NET_DEVICES", "value": value})
        if kv.nixl_backend and spec.model.engine == "SGLang":
            env.append({"name": "SGLANG_DISAGGREGATION_NIXL_BACKEND", "value": kv.nixl_backend})
        if spec.model.engine == "VLLM":
            # vLLM advertises this host to the other side for the NIXL handshake; its default,
            # localhost, cannot be reached from another pod.
            env.append(
                {
                    "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                }
            )
    return env
