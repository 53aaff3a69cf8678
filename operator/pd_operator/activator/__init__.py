"""The activator: holds requests at the router's door while the pools start from zero.

With `spec.scaling.idleSeconds` the router pod runs it in front of the router, from the
operator's image (`python -m pd_operator.activator`). The real routers answer at once with an
error when they have no workers (vllm-router: 503 "No available workers: 0 prefill, 0 decode"),
so a client's first request after scale-to-zero would fail; the activator keeps it until the
router can serve it, and its metrics tell the operator that a request is waiting.
"""
