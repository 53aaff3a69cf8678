"""Engine-shaped metrics that a test controls, scraped by the real Prometheus."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pd_tools.localcluster.processes import free_port

BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class FakeEngine:
    """One pod's worth of vLLM metrics on its own loopback port, served by prometheus_client as
    vLLM serves them (Prometheus' OpenMetrics scrape makes it escape the colons: vllm_...)."""

    def __init__(self, prometheus, name: str, labels: dict[str, str]) -> None:
        self.registry = CollectorRegistry()
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "ttft", ["model_name"], buckets=BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "itl", ["model_name"], buckets=BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "w", ["model_name"], registry=self.registry
        )
        self.prompt = Counter("vllm:prompt_tokens", "p", ["model_name"], registry=self.registry)
        self.cached = Counter("vllm:prefix_cache_hits", "c", ["model_name"], registry=self.registry)
        self.running = Gauge(
            "vllm:num_requests_running", "r", ["model_name"], registry=self.registry
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "k", ["model_name"], registry=self.registry
        )
        self.generation = Counter(
            "vllm:generation_tokens", "g", ["model_name"], registry=self.registry
        )
        # The KV hand-off: NIXL's transfer time (vLLM records it on decode, which pulls), and
        # prefill's queue and compute time.
        self.transfer = Histogram(
            "vllm:nixl_xfer_time_seconds", "x", ["model_name"], buckets=BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds", "q", ["model_name"], buckets=BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.prefill_time = Histogram(
            "vllm:request_prefill_time_seconds", "p", ["model_name"], buckets=BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        port = free_port()
        self.server, self.thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        prometheus.set_targets(name, [f"127.0.0.1:{port}"], labels)

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)
