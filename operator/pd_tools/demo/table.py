"""The live table: one row per pool from the PDDeployment's status, with the client's view."""

import math
import re
from dataclasses import dataclass
from typing import Any

from pd_tools.demo.settings import ITL_TARGET_MS, TTFT_TARGET_MS, WIDTH

DECISION_LINES = 4


@dataclass
class Sample:
    """One table row at one moment (seconds since the load started)."""

    t: float
    role: str
    pool: str
    ready: int
    desired: int
    pending: int
    latency_ms: int | None  # the operator's reading for the role: TTFT (prefill), ITL (decode)
    target_ms: int
    slo: str  # met, VIOLATED, or - (no reading)
    client_ms: float | None  # the client's P50 of the same latency over the last window
    sent_per_s: float
    completed_per_s: float


def verdict(latency_ms: int | None, target_ms: int) -> str:
    """A role's SLO from its own reading against its own target."""
    if latency_ms is None:
        return "-"
    return "met" if latency_ms <= target_ms else "VIOLATED"


def read_samples(
    status: dict[str, Any], t: float, client_now: dict[str, float]
) -> tuple[list[Sample], dict[str, Any]]:
    """The pool rows from the PDDeployment's status, and its router status."""
    observed = status.get("observed") or {}
    rows = []
    for pool in status.get("pools") or []:
        prefill = pool["role"] == "prefill"
        latency = observed.get("ttftMilliseconds" if prefill else "itlMilliseconds")
        target = TTFT_TARGET_MS if prefill else ITL_TARGET_MS
        mine = client_now["ttft_ms" if prefill else "itl_ms"]
        rows.append(
            Sample(
                t=t,
                role=pool["role"],
                pool=pool["name"],
                ready=pool.get("readyReplicas", 0),
                desired=pool.get("desiredReplicas", 0),
                pending=pool.get("unschedulableReplicas", 0),
                latency_ms=latency,
                target_ms=target,
                slo=verdict(latency, target),
                client_ms=None if math.isnan(mine) else mine,
                sent_per_s=client_now["sent_per_s"],
                completed_per_s=client_now["completed_per_s"],
            )
        )
    return rows, status.get("router") or {}


def _top_level(text: str, separator: str) -> list[str]:
    """`text` split at `separator` outside parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i = i + len(separator)
            continue
        i += 1
    return [*parts, text[start:]]


def short_reason(reason: str, width: int) -> str:
    """A decision's reason in `width` columns: per role its move and as many of the first
    clauses of why as fit, without nested details; cut with '~' when even one does not."""
    roles = []
    for part in _top_level(reason, "; "):
        head, bracket, why = part.partition(" (")
        clauses = _top_level(why.removesuffix(")"), ", ") if bracket else []
        roles.append((head, [_NESTED.sub("", clause) for clause in clauses]))
    # The roles that move replicas keep their second clause (the demand) longest.
    for moved, held in ((2, 2), (2, 1), (1, 1)):
        text = "; ".join(
            f"{head} ({', '.join(clauses[: moved if '->' in head else held])})" if clauses else head
            for head, clauses in roles
        )
        if len(text) <= width:
            return text
    text = text.replace("x target", "x")  # "TTFT 1.5x": still says what it is
    return text if len(text) <= width else text[: width - 1] + "~"


_NESTED = re.compile(r" \([^()]*\)")


def render(
    rows: list[Sample],
    router: dict[str, Any],
    decisions: list[tuple[str, str]],
    header: str,
    footer: str,
) -> str:
    """The live table, WIDTH columns at most."""
    lines = [
        header,
        f"{'pool':<16}{'ready':>6}{'desired':>8}{'pending':>8}   {'operator P50':<13}"
        f"{'target':>8}  {'SLO':<10}{'client P50':>11}",
    ]
    for row in rows:
        kind = "TTFT" if row.role == "prefill" else "ITL"
        seen = f"{row.latency_ms} ms" if row.latency_ms is not None else "-"
        mine = "-" if row.client_ms is None else f"{row.client_ms:,.1f} ms"
        lines.append(
            f"{row.role + '/' + row.pool:<16}{row.ready:>6}{row.desired:>8}{row.pending:>8}   "
            f"{kind:<5}{seen:>8}{row.target_ms:>5} ms  {row.slo:<10}{mine:>11}"
        )
    if router:
        lines.append(
            f"{'router':<16}{router.get('readyReplicas', 0):>6}"
            f"{router.get('desiredReplicas', 0):>8}"
        )
    lines += footer.splitlines()
    for stamp, reason in decisions[-DECISION_LINES:]:
        lines.append(f" {stamp} {short_reason(reason, WIDTH - 2 - len(stamp))}")
    return "\n".join(line[:WIDTH] for line in lines)
