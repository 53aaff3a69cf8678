"""The bounds of the latency histograms a PDDeployment's engines export.

A percentile read with `histogram_quantile` is only known to lie in its bucket
(`core.signals.bucket_of`); a bound at the SLO target lets the histogram say which side of the
target the percentile is on. vLLM's bounds are fixed in its source (vllm-project/vllm#34370).
SGLang takes them on its command line (`--bucket-time-to-first-token`,
`--bucket-inter-token-latency`: seconds, `nargs="+"`); where `spec.model.args` sets them, the
policy reads the latency with the user's bounds. The operator does not set them itself: measured
on the robustness benchmark (`simulate(buckets="at-targets")`, `at_target`), bounds at the
targets served more decode ramps in time but cost 1.2-1.4x the card-hours with today's capacity
learner (docs/benchmarks.md), an SGLang without the flags would refuse to start, and every SLO
edit would restart the pools. `exported_bounds` is the one answer to "what does this role's
latency histogram resolve", for the scaling rules and the simulators alike.
"""

from collections.abc import Iterable, Sequence

from pd_operator.api.spec import Engine, PDDeploymentSpec, Role
from pd_operator.core.signals import LATENCY_BUCKETS
from pd_operator.core.tuning import TUNING

# The SGLang flag that sets the bounds of the latency each role scales on.
SGLANG_BUCKET_FLAGS: dict[Role, str] = {
    "prefill": "--bucket-time-to-first-token",
    "decode": "--bucket-inter-token-latency",
}


def default_bounds(engine: Engine, role: Role) -> tuple[float, ...]:
    """The engine's own bounds of the histogram the role's latency is read from."""
    return LATENCY_BUCKETS.get(engine, {}).get(role, ())


def target_bounds(spec: PDDeploymentSpec, role: Role) -> tuple[float, float]:
    """The bounds a histogram needs around the role's target (seconds): the target, and
    `TUNING.learn_low_ratio` of it (whole milliseconds), where the capacity learner's "near the
    SLO" begins. Without the second, the bucket under the target can be twice as wide as its
    lower bound (vLLM's ITL: 10 to 20 ms), which the learner takes as narrow enough to read
    "near" from an interpolated P99 at 19.8 ms whatever the gaps are."""
    milliseconds = spec.slo.target(role).target_milliseconds
    return milliseconds / 1000, round(milliseconds * TUNING.learn_low_ratio) / 1000


def with_bounds(bounds: Iterable[float], *extra: float) -> tuple[float, ...]:
    """`bounds` and `extra`, sorted, each once: what a Prometheus histogram accepts."""
    return tuple(sorted({*bounds, *extra}))


def at_target(spec: PDDeploymentSpec, role: Role) -> tuple[float, ...]:
    """The spec's engine's default bounds with those around the role's target among them."""
    return with_bounds(default_bounds(spec.model.engine, role), *target_bounds(spec, role))


def bounds_in_args(args: Sequence[str], flag: str) -> tuple[float, ...] | None:
    """The bounds an engine command line gives `flag` (argparse's reading: the numbers after
    its last occurrence, or its `=value`), sorted; None: the flag is not there."""
    found: list[float] | None = None
    for index, arg in enumerate(args):
        if arg == flag:
            found = list(_numbers(args[index + 1 :]))
        elif arg.startswith(f"{flag}="):
            found = list(_numbers([arg.partition("=")[2]]))
    return None if found is None else with_bounds(found)


def _numbers(args: Sequence[str]) -> Iterable[float]:
    """The leading arguments that read as numbers."""
    for arg in args:
        try:
            yield float(arg)
        except ValueError:
            return


def exported_bounds(spec: PDDeploymentSpec, role: Role) -> tuple[float, ...]:
    """The bounds of the histogram the role's latency is read from, as the spec's engines
    export it: SGLang's as the user's args set them, else the engine's defaults."""
    user = None
    if spec.model.engine == "SGLang":
        user = bounds_in_args(spec.model.args, SGLANG_BUCKET_FLAGS[role])
    return user if user is not None else default_bounds(spec.model.engine, role)
