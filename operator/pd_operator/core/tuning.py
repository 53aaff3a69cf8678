"""Every number the scaling policy is tuned by, in one place, each with its reason.

The rules read them from `TUNING` (`core.control_law`, `core.learning`, `core.policy`); a
benchmark that tries another value replaces it there (`dataclasses.replace`) rather than hunting
for a module constant. A change here moves the benchmarks (`bench/windows.py`,
`bench/robustness.py`): quote their tables before and after.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    # --- The control law (core.control_law): how much capacity the signals call for. ---

    # Grow to a size at which the demand uses this share of the estimated capacity.
    target_utilisation: float = 0.8
    # Shrink only to a size at which the demand would use at most this share.
    scale_down_utilisation: float = 0.7
    # Prefill's estimate is a throughput; how much of it a replica may use depends on the TTFT
    # target against the prompts' service times (short prompts and a target of seconds allow
    # 95%, prompts of tens of thousands of tokens far less). Prefill grows to a size at which
    # the demand is this share of that utilisation, and shrinks only to one at which it is at
    # most the second: the same margins as the two above leave under 1.
    prefill_grow_share: float = 0.9
    prefill_shrink_share: float = 0.8
    # Latency/target at or above which the role holds its size: close enough to the SLO that a
    # smaller size would likely breach it.
    hold_ratio: float = 0.9
    # Latency is a steep function of load near saturation: a 5x breach does not mean 5x
    # replicas. Feedback at most doubles the ready capacity per decision; feed-forward sizes
    # the rest.
    max_feedback_gain: float = 2.0
    # Latency/target under which a role whose capacity is only known from below (it has never
    # run near its SLO) may shed one replica per scale-down window, to find out...
    probe_ratio: float = 0.6
    # ...as long as each remaining replica then carries at most this multiple of the load per
    # replica already seen within the SLO: a probe never leaps far into the unknown.
    max_probe_load: float = 1.5
    # KV-cache usage (decode) to grow at and to stay under after shrinking.
    kv_target: float = 0.8
    kv_scale_down: float = 0.7
    # A tail percentile's breach with the mean under this share of the target is a tail of a
    # few over-long requests, not a capacity shortage (see `RoleLoad.tail_only`).
    tail_percentiles: frozenset[str] = frozenset({"P90", "P95", "P99"})
    tail_mean_ratio: float = 0.5
    # Such a tail at or over this multiple of the target still holds the size: it adds no
    # replica, but it may be queueing behind long prompts as well as the prompts themselves,
    # and shedding a replica under it adds to the queue (Mooncake x0.5-x2 over five draws
    # each: attainment 0.985-0.992 on 4 of 15 without it, >= 0.99 on all 15 with it; see
    # docs/autoscaling.md).
    tail_hold_ratio: float = 1.5
    # A sample older than this many decision intervals is as good as none.
    stale_intervals: int = 3

    # --- Learning (core.learning): each pool's capacity per replica. ---

    # Latency/target above which the replicas are past their SLO capacity.
    breach_ratio: float = 1.1
    # Latency/target under which the served rate only bounds capacity from below.
    learn_low_ratio: float = 0.85
    # A latency bucket spanning more than this factor (upper/lower bound) cannot tell a replica
    # at its SLO capacity from one at half of it: readings in it do not count as "near the
    # target".
    max_bucket_span: float = 2.0
    # Weight of one near-target observation in the moving average.
    ema_weight: float = 0.3
    # In a breach the served rate is divided by the latency ratio (a linear latency model) to
    # estimate the rate at the target; capped because far past saturation latency is all
    # queueing and says nothing more about capacity.
    max_breach_correction: float = 1.25
    # Prompt length for seeds before any traffic shows the real one. Assumption: a typical
    # chat or RAG prompt; learning replaces it within minutes of traffic.
    default_prompt_tokens: int = 4096
    # Tokens per prefill batch: vLLM's default max_num_batched_tokens on large cards.
    prefill_batch_tokens: int = 8192
    # Prompt lengths are not in the signals, only their mean. Assumption: they vary like an
    # exponential distribution (squared coefficient of variation 1, the maximum-entropy choice
    # for a known mean); the traces in ../shared/traces measure 0.9-1.7, and learning corrects
    # the rest.
    prompt_length_cv2: float = 1.0
    # Equally likely prompt lengths the queueing estimate of prefill's utilisation at the SLO
    # uses.
    length_classes: int = 16
    # The largest share of prompt tokens found in the prefix cache that prefill seeds count
    # on: the share is a window's mean, and a burst of new prompts behind it computes every
    # token, so no seed assumes more than ten times the compute-free tokens of a cold prompt.
    max_cached_share: float = 0.9
    # Decode batches searched for the seed; engines default to at most 1024 sequences.
    max_decode_batch: int = 1024

    # --- The decision (core.policy): timing, warm-up, windows, memory. ---

    # During warm-up, a breach (or demand) this much above the one that triggered the last
    # scale-up justifies another scale-up before the new replicas are Ready.
    worse_factor: float = 1.2
    # Scale-up to Ready before any was observed, when the profiles cannot tell. Assumption:
    # large models take minutes to load and warm up.
    default_load_seconds: float = 300.0
    load_ema_weight: float = 0.5
    # Weight of one decision's sample of the running requests in their moving averages: about
    # the last 20 decisions (10 minutes at the default 30 s interval) tell how much the batch
    # swings.
    running_ema_weight: float = 0.05
    # A breach that a scale-up lowered by less than this share, once the new replicas served a
    # whole window and the demand did not grow, is not one that replicas fix: a latency floor
    # above the target (prompts too long for it, a percentile in the tail of a few such
    # requests).
    futile_improvement: float = 0.1
    # A role's load is steady when, over a whole scale-down window, its latency stayed under
    # this share of the target and its demand moved between decisions by at most
    # `steady_demand_change` of its mean (root mean square of the changes, over root 2: a
    # random wobble's own spread). Then the short window (`scaleDown.steadyStabilizationSeconds`)
    # applies: a load that has not come near the target nor swung for that long is not about to
    # come back within a model load, and waiting the long window costs a replica it does not
    # need. Bursty loads (a 30 s burst between quiet minutes) and long-prompt tails (a P99 near
    # the target) keep the long window.
    steady_latency_ratio: float = 0.5
    steady_demand_change: float = 0.1
    # At most about this many samples per window (they are stored in status): with decisions
    # more often than window / steady_samples, a sample that close to the one before it is
    # dropped when the next comes (the newest is always kept).
    steady_samples: int = 30
    # The longest a pool whose sheds were undone waits before the next (`policy._shed_memory`):
    # an hour, past which a load that keeps coming back is a daily pattern, for schedules or
    # seasons.
    max_shed_wait: float = 3600.0


TUNING = Tuning()
