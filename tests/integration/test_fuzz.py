"""A thousand generated PDDeployments through the models and a real apiserver (issue #28).

For each document (tests/fuzzdocs.py): the models and admission agree on it; nothing the
operator runs on it crashes; every child it plans for an admitted object is admitted too and
reads as converged once the apiserver has stored it (0 steady writes); and no two PDDeployments
ever plan the same child. Every request is a server-side dry run, so the whole run writes nothing.

The seed is fixed with CI=true; elsewhere PD_FUZZ_SEED, else a random one. It is printed, and
named in every failure: `PD_FUZZ_SEED=<seed> pytest tests/integration/test_fuzz.py` replays it.
PD_FUZZ_DOCUMENTS changes how many documents are drawn (1000).
"""

import json
import os
import random
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fuzzdocs import Case, generate
from pd_operator.adapters.kube import FIELD_MANAGER, api_message, call_json, object_path
from pd_operator.api import API_VERSION, InvalidSpecError, PDDeploymentStatus, parse_pddeployment
from pd_operator.core.children import child_key
from pd_operator.core.reconcile import plan_children
from pd_operator.core.status import compute_status, invalid_spec_status

CI_SEED = 28
DOCUMENTS = int(os.environ.get("PD_FUZZ_DOCUMENTS", "1000"))
THREADS = 4
NOW = "2026-12-01T00:00:00Z"
DRY_RUN = [("dryRun", "All"), ("fieldValidation", "Strict")]
APPLY = "application/apply-patch+yaml"
SHOWN_FAILURES = 15

# The only disagreements that are by design, each matched on the refusing side's words.
# What the models refuse although admission cannot check it: the operator reports such an
# object Stalled (InvalidSpec) and starts nothing new for it.
ALLOWED: list[tuple[str, str]] = [
    (
        "unknown time zone",
        "no OpenAPI keyword or CEL function knows the IANA time-zone database: admission checks "
        "a zone's shape (TIME_ZONE_PATTERN), the models whether it exists",
    ),
]
# What admission refuses and the models read anyway, so that objects stored under an older
# CRD keep working instead of stalling.
ADMISSION_ONLY: list[tuple[str, str]] = [
    (
        "scaleDown.steadyStabilizationSeconds must be at most stabilizationSeconds",
        "older CRDs defaulted the steady window to 60 over shorter long windows; the models read "
        "such an object with the window capped (ScaleDownPolicy.steady_window_seconds)",
    ),
]


def seed() -> int:
    if os.environ.get("CI") == "true":
        return CI_SEED
    chosen = os.environ.get("PD_FUZZ_SEED")
    return int(chosen) if chosen else random.SystemRandom().randrange(2**31)


@dataclass
class Outcome:
    """What one document did."""

    case: Case
    models: list[str] | None = None  # the models' problems; None: accepted
    server: str | None = None  # the apiserver's refusal; None: admitted
    allowed: bool = False
    children: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) planned
    failures: list[str] = field(default_factory=list)


def _dry_run(
    api_client: client.ApiClient, path: str, body: Any, *, apply: bool = False
) -> tuple[dict[str, Any], str]:
    """The object the apiserver would store on a create (or a server-side apply), or
    ({}, its refusal: the status code, the message, then each cause on a line)."""
    try:
        if apply:
            query = [*DRY_RUN, ("fieldManager", FIELD_MANAGER), ("force", "true")]
            return call_json(api_client, "PATCH", path, body, APPLY, query=query), ""
        return call_json(api_client, "POST", path, body, query=DRY_RUN), ""
    except ApiException as error:
        try:
            causes = json.loads(error.body or "{}").get("details", {}).get("causes") or []
        except ValueError:
            causes = []
        lines = [f"{c.get('field', '')}: {c.get('message', '')}" for c in causes]
        return {}, "\n".join([f"{error.status} {api_message(error)}", *lines])


def _verdict(problems: list[str] | None) -> str:
    return "accepted" if problems is None else "refused: " + "; ".join(problems)


def _allowed(problems: list[str]) -> bool:
    return all(any(words in problem for words, _ in ALLOWED) for problem in problems)


def _by_design(outcome: Outcome) -> bool:
    """Whether the models and admission disagree on this document only as ALLOWED or
    ADMISSION_ONLY say they should."""
    if outcome.server is None:
        return bool(outcome.models) and _allowed(outcome.models or [])
    causes = outcome.server.splitlines()[1:]  # one per problem, after the status line
    return bool(causes) and all(
        any(words in cause for words, _ in ADMISSION_ONLY) for cause in causes
    )


def _status_is_valid(status: Mapping[str, Any], what: str, outcome: Outcome) -> None:
    try:
        json.dumps(status)
        PDDeploymentStatus.model_validate(status, by_alias=True)
    except (TypeError, ValueError) as error:
        outcome.failures.append(f"{what} is not a valid status: {error}")


def _converge(api_client: client.ApiClient, stored: dict[str, Any], outcome: Outcome) -> None:
    """Dry-run create every child of an admitted object; whatever the apiserver would store
    must read as converged."""
    pdd = parse_pddeployment(stored)
    plan = plan_children(pdd, {}, [])
    status, _ = compute_status(
        pdd,
        children={},
        pods=[],
        replicas=plan.replicas,
        problems=plan.problems,
        previous={},
        now=NOW,
    )
    _status_is_valid(status, "the first status", outcome)
    keys = [child_key(m) for m in plan.apply]
    if len(set(keys)) != len(keys):
        twice = [k for k, n in Counter(keys).items() if n > 1]
        outcome.failures.append(f"plans one child twice: {twice}")
    outcome.children = [(kind, name) for _, kind, name in keys]
    returned: dict[Any, dict[str, Any]] = {}
    for manifest in plan.apply:
        meta = manifest["metadata"]
        path = object_path(manifest["apiVersion"], manifest["kind"], meta["namespace"])
        obj, refused = _dry_run(api_client, path, manifest)
        how = "a create"
        if not refused:
            # The operator creates a child, then applies it on every later change.
            _, refused = _dry_run(api_client, f"{path}/{meta['name']}", manifest, apply=True)
            how = "a server-side apply"
        if refused:
            outcome.failures.append(
                f"admission gap: the object was admitted, {how} of its {manifest['kind']} "
                f"{meta['name']} is refused: {refused.splitlines()[0]}"
            )
            continue
        obj.update(apiVersion=manifest["apiVersion"], kind=manifest["kind"])
        returned[child_key(obj)] = obj
    again = plan_children(pdd, returned, [])
    # A refused child is reported above; what the apiserver stored must need no write.
    again.apply = [m for m in again.apply if child_key(m) in returned]
    if again.apply or again.delete:
        rewrites = [f"{m['kind']}/{m['metadata']['name']}" for m in again.apply]
        deletes = [f"{r.kind}/{r.name}" for r in again.delete]
        outcome.failures.append(
            f"not converged once stored: would apply {rewrites}, delete {deletes}"
        )
    status, _ = compute_status(
        pdd,
        children=returned,
        pods=[],
        replicas=again.replicas,
        problems=again.problems,
        previous=status,
        now=NOW,
    )
    _status_is_valid(status, "the status over the stored children", outcome)


def check(api_client: client.ApiClient, namespace: str, case: Case) -> Outcome:
    """Everything the test asserts about one document, as failures of its Outcome."""
    outcome = Outcome(case)
    try:
        try:
            parse_pddeployment(case.document)
        except InvalidSpecError as error:
            outcome.models = error.problems
        path = object_path(API_VERSION, "PDDeployment", namespace)
        stored, outcome.server = _dry_run(api_client, path, case.document)
        outcome.server = outcome.server or None
        if outcome.server and not outcome.server.startswith(("400 ", "422 ")):
            outcome.failures.append(f"the apiserver answered {outcome.server.splitlines()[0]}")
        if (outcome.models is None) != (outcome.server is None):
            if _by_design(outcome):
                outcome.allowed = True
            else:
                outcome.failures.append(
                    f"models and admission disagree: models {_verdict(outcome.models)}; "
                    f"apiserver {(outcome.server or 'admitted').splitlines()[0]}"
                )
        if outcome.models is not None:
            status, _ = invalid_spec_status(1, outcome.models, {}, NOW)
            _status_is_valid(status, "the invalid-spec status", outcome)
        if outcome.server is None:
            stored["metadata"]["namespace"] = namespace
            try:
                parse_pddeployment(stored)
            except InvalidSpecError as error:
                if not (outcome.allowed and _allowed(error.problems)):
                    outcome.failures.append(f"the stored object is refused: {error.problems}")
                return outcome
            _converge(api_client, stored, outcome)
    except Exception:  # a crash anywhere is this document's failure, reported with it
        outcome.failures.append("crashed:\n" + traceback.format_exc(limit=6))
    return outcome


def _shared_children(outcomes: list[Outcome]) -> list[str]:
    """Children that two PDDeployments of different names would both claim."""
    owners: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for outcome in outcomes:
        name = outcome.case.document["metadata"]["name"]
        for child in outcome.children:
            owners[child].setdefault(name, outcome.case.index)
    return [
        f"{kind} {name} is planned by " + ", ".join(f"{o} (#{i})" for o, i in claim.items())
        for (kind, name), claim in sorted(owners.items())
        if len(claim) > 1
    ]


def _report(outcome: Outcome, fuzz_seed: int) -> str:
    document = json.dumps(outcome.case.document, ensure_ascii=False)
    return (
        f"[seed {fuzz_seed}] {outcome.case.describe()}\n  "
        + "\n  ".join(f if len(f) <= 800 else f[:800] + "..." for f in outcome.failures)
        + f"\n  document: {document[:1500]}"
    )


def test_generated_documents_agree_run_and_converge(api_client, namespace):
    fuzz_seed = seed()
    print(f"\nfuzz seed {fuzz_seed} (replay: PD_FUZZ_SEED={fuzz_seed}), {DOCUMENTS} documents")
    started = time.monotonic()
    cases = generate(fuzz_seed, DOCUMENTS)
    with ThreadPoolExecutor(THREADS) as pool:
        outcomes = list(pool.map(lambda case: check(api_client, namespace, case), cases))
    elapsed = time.monotonic() - started

    admitted = [o for o in outcomes if o.models is None and o.server is None]
    shared = _shared_children(admitted)
    # The simplest failing documents first: they are the ones to read.
    failed = sorted((o for o in outcomes if o.failures), key=lambda o: len(o.case.mutations))
    rows = [
        ("documents", len(outcomes)),
        ("accepted by both", len(admitted)),
        ("refused by both", sum(o.models is not None and o.server is not None for o in outcomes)),
        ("disagreeing by design", sum(o.allowed for o in outcomes)),
        ("children checked", sum(len(o.children) for o in admitted)),
        ("distinct names admitted", len({o.case.document["metadata"]["name"] for o in admitted})),
        ("documents failing", len(failed)),
        ("children shared", len(shared)),
        ("seconds", round(elapsed, 1)),
    ]
    print("\n".join(f"  {label:<28}{value:>8}" for label, value in rows))

    problems = [_report(o, fuzz_seed) for o in failed[:SHOWN_FAILURES]] + shared[:SHOWN_FAILURES]
    assert not failed and not shared, (
        f"seed {fuzz_seed}: {len(failed)} of {len(outcomes)} documents failed, "
        f"{len(shared)} children shared\n\n" + "\n\n".join(problems)
    )
    # The generator leans valid: a run that admits few documents tests little of steps 2-4.
    assert len(admitted) >= len(outcomes) // 4, f"seed {fuzz_seed}: only {len(admitted)} admitted"
