"""What an offline replay returns and how it is shown.

`RequestOutcome` is one request's latencies and whether they met the SLO; `SimResult` is a
whole run (cost, card-hours, scale actions, the replica timeline and why it changed) with its
JSON forms; `table_row` and `markdown_table` render results as the comparison table.
"""

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RequestOutcome:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    ttft_s: float  # NaN: unfinished
    tpot_s: float  # mean inter-token latency; NaN for one-token answers or unfinished
    ttft_ok: bool
    itl_ok: bool
    # False when the request misses a target even alone on an idle deployment (see
    # `idle_latencies`): no capacity and no policy can serve it in time.
    feasible: bool = True
    # True when the engines refuse it: its prompt and answer exceed the context length
    # (`context_limit`). Never served, never feasible.
    rejected: bool = False


@dataclass(frozen=True)
class SimResult:
    """What a run cost and how well it served."""

    policy: str
    outcomes: list[RequestOutcome]
    card_hours: dict[str, float]  # per accelerator profile
    cost: float
    scale_actions: int
    timeline: list[tuple[float, dict[str, int]]]  # (time, replicas per "role/pool") on change
    end_s: float
    wall_s: float
    # Why each change after the first entry of `timeline` was made, at the same times: the
    # policy's own words (pd-operator: its decision's reason, as status shows it).
    reasons: list[tuple[float, str]] = field(default_factory=list)
    # What the replicas scale-downs removed were doing then (`fleet.RemovalCost.row`).
    removed: dict[str, float] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return len(self.outcomes)

    @property
    def unfinished(self) -> int:
        """Requests taken but not finished when the replay stopped."""
        return sum(1 for o in self.outcomes if math.isnan(o.ttft_s) and not o.rejected)

    @property
    def rejected(self) -> int:
        """Requests the engines refuse: prompt and answer over the context length."""
        return sum(1 for o in self.outcomes if o.rejected)

    @property
    def infeasible(self) -> int:
        """Requests taken that miss a target even alone on an idle deployment."""
        return sum(1 for o in self.outcomes if not o.feasible and not o.rejected)

    @property
    def feasible(self) -> int:
        """Requests an idle deployment serves in time: what attainment is held to."""
        return sum(1 for o in self.outcomes if o.feasible)

    def attainment(self) -> dict[str, float]:
        """Share of all requests meeting the TTFT target, the ITL target, and both (a rejected
        request meets neither); and `feasible`: the share meeting both among the requests that
        an idle deployment serves in time (what a policy can be held to)."""
        n = max(1, len(self.outcomes))
        feasible = [o for o in self.outcomes if o.feasible]
        return {
            "ttft": sum(o.ttft_ok for o in self.outcomes) / n,
            "itl": sum(o.itl_ok for o in self.outcomes) / n,
            "both": sum(o.ttft_ok and o.itl_ok for o in self.outcomes) / n,
            "feasible": sum(o.ttft_ok and o.itl_ok for o in feasible) / max(1, len(feasible)),
        }

    @property
    def tokens(self) -> int:
        """Input plus output tokens of the finished requests."""
        done = (o for o in self.outcomes if not math.isnan(o.ttft_s))
        return sum(o.input_tokens + o.output_tokens for o in done)

    @property
    def cost_per_million_tokens(self) -> float:
        return self.cost / (self.tokens / 1e6) if self.tokens else math.nan

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary (no per-request rows)."""
        return {
            "policy": self.policy,
            "requests": self.requests,
            "unfinished": self.unfinished,
            "rejected": self.rejected,
            "infeasible": self.infeasible,
            "attainment": self.attainment(),
            "card_hours": self.card_hours,
            "cost": self.cost,
            "tokens": self.tokens,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "scale_actions": self.scale_actions,
            "simulated_s": self.end_s,
            "wall_s": self.wall_s,
        }

    def changes(self) -> list[dict[str, Any]]:
        """The replica timeline: replicas per pool from `t`, and why they changed there."""
        why = dict(self.reasons)
        return [{"t": t, "replicas": r, "reason": why.get(t, "")} for t, r in self.timeline]

    def change_lines(self) -> list[str]:
        """Each change after the start as one line: time, the pools that moved, and why."""
        lines, why = [], dict(self.reasons)
        for (_, before), (t, after) in itertools.pairwise(self.timeline):
            moved = ", ".join(
                f"{pool} {before.get(pool, 0)}->{count}"
                for pool, count in after.items()
                if count != before.get(pool, 0)
            )
            reason = why.get(t, "")
            lines.append(f"{t:7.0f} s  {moved}" + (f": {reason}" if reason else ""))
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The summary plus the replica timeline (with reasons) and per-request TTFT/TPOT."""
        out = self.summary()
        out["timeline"] = self.changes()
        out["requests_detail"] = [
            {
                "arrival_s": o.arrival_s,
                "input_tokens": o.input_tokens,
                "output_tokens": o.output_tokens,
                "ttft_s": _json_float(o.ttft_s),
                "tpot_s": _json_float(o.tpot_s),
                "feasible": o.feasible,
                "rejected": o.rejected,
            }
            for o in self.outcomes
        ]
        return out


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else value


TABLE_COLUMNS = (
    "policy",
    "attain_feasible",
    "infeasible",
    "rejected",
    "attain_both",
    "attain_ttft",
    "attain_itl",
    "card_hours",
    "cost",
    "cost_per_m_tokens",
    "scale_actions",
    "wall_s_per_10k",
)


def table_row(result: SimResult) -> dict[str, str]:
    """One result as the columns of `TABLE_COLUMNS` (card-hours per type as `type:hours`)."""
    attainment = result.attainment()
    per_10k = result.wall_s / max(1, result.requests) * 10_000
    return {
        "policy": result.policy,
        "attain_feasible": f"{attainment['feasible']:.3f}",
        "infeasible": str(result.infeasible),
        "rejected": str(result.rejected),
        "attain_both": f"{attainment['both']:.3f}",
        "attain_ttft": f"{attainment['ttft']:.3f}",
        "attain_itl": f"{attainment['itl']:.3f}",
        "card_hours": " ".join(f"{k}:{v:.1f}" for k, v in result.card_hours.items()),
        "cost": f"{result.cost:.2f}",
        "cost_per_m_tokens": f"{result.cost_per_million_tokens:.3f}",
        "scale_actions": str(result.scale_actions),
        "wall_s_per_10k": f"{per_10k:.2f}",
    }


def markdown_table(rows: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    """Rows as a GitHub markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows]
    return "\n".join(lines)
