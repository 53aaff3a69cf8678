"""The preStop hook that lets an engine replica finish its requests before it is stopped.

A terminating pod leaves the Service's endpoints at once, but its engine stops only on SIGTERM,
which the kubelet sends when the preStop hook returns. vLLM aborts what it runs on SIGTERM (its
`--shutdown-timeout`, from 0.18, defaults to 0), so the drain has to happen in the hook, before
the signal: that works with every engine version. The hook waits until the engine's own
/metrics show no request running or waiting, then returns; the cards are freed as soon as the
replica is idle instead of after a fixed wait. It always returns within `drainSeconds`.

It runs in the engine's image with the engine's Python (both engines are Python programs) and
the standard library only. A prefill replica waits KV_HANDOFF_SECONDS more once idle: decode
replicas read a prompt's KV cache from it after the request has left its running set.
"""

from pd_operator.api.spec import Engine, Role
from pd_operator.core import engine_metrics
from pd_operator.core.engine_args import METRICS_PATH, engine_port

# Requests routed just before the pod left the endpoints may still arrive: never idle earlier.
SETTLE_SECONDS = 5
KV_HANDOFF_SECONDS = 5


def _request_gauges(*spellings: engine_metrics.EngineMetricNames) -> tuple[str, ...]:
    return tuple(name for names in spellings for name in (names.running, names.waiting) if name)


# The gauges that count a replica's requests, in every spelling an engine version uses.
_BUSY_GAUGES: dict[Engine, tuple[str, ...]] = {
    "VLLM": _request_gauges(engine_metrics.VLLM, engine_metrics.VLLM_UNDERSCORE),
    "SGLang": _request_gauges(engine_metrics.SGLANG, engine_metrics.SGLANG_UNDERSCORE),
}
# argv: metrics URL, comma-separated gauge names, seconds to settle, seconds after idle, limit.
# Idle is two reads in a row with every gauge at 0; an engine that no longer answers is done.
# No proxy: an engine pod's HTTP_PROXY (for model downloads) must not take loopback reads.
SCRIPT = """\
import sys, time, urllib.request
url, names = sys.argv[1], set(sys.argv[2].split(","))
settle, tail, limit = map(float, sys.argv[3:6])
end = time.monotonic() + limit
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def requests():
    total = 0.0
    for line in opener.open(url, timeout=2).read().decode().splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in names:  # the value follows the labels, or the name: "name{...} 2.0"
            value = line.rsplit("}", 1)[1] if "}" in line else line.split(" ", 1)[1]
            total += float(value.split()[0])
    return total
time.sleep(min(settle, limit))
idle = 0
while idle < 2 and time.monotonic() < end:
    try:
        idle = idle + 1 if requests() == 0 else 0
    except Exception:  # gone, or not an exposition: nothing left to wait for
        break
    time.sleep(0 if idle == 2 else 1)
if idle == 2:
    time.sleep(max(0.0, min(tail, end - time.monotonic())))
"""


def drain_command(engine: Engine, role: Role, seconds: int) -> list[str]:
    """The preStop command of an engine container: return once the replica is idle, or after
    `seconds` at most."""
    url = f"http://127.0.0.1:{engine_port(engine)}{METRICS_PATH}"
    tail = KV_HANDOFF_SECONDS if role == "prefill" else 0
    arguments = [url, ",".join(_BUSY_GAUGES[engine]), str(SETTLE_SECONDS), str(tail), str(seconds)]
    return ["python3", "-c", SCRIPT, *arguments]
