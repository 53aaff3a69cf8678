"""Deterministic, DNS-valid names of a PDDeployment's children, distinct between objects.

Children are named from the parent and the pool, so a reconcile finds the same objects again
without bookkeeping: `{pdd}-{role}-{pool}` for a pool's Deployment and budget, `{pdd}-{role}`
for a role's Service and its PDPool (mode External), `{pdd}-router` for the router's objects
and `{pdd}` for the endpoint Service (`pd-` first for a Service whose name would start with a
digit).

Names joined with '-' can be read two ways (`a` with pool `prefill-x` and `a-prefill` with
pool `x` both give `a-prefill-prefill-x`; `1a` and `pd-1a` both give `pd-1a-prefill`). A
PDDeployment name that holds no suffix word (`prefill`, `decode`, `router` as a '-'-separated
part) and does not start like the digit prefix (`pd-` and a digit) reads one way only: the
first suffix word ends it. Such names keep the readable scheme; the children of any other
PDDeployment get a hash of (name, role, pool) after the readable part, so that two objects
never ask for one name. Names longer than a DNS label are cut and given a hash, as before.
What is left (a crafted name equal to another's hashed one, or an object a user created) the
reconciler refuses with `NameConflict` instead of taking it over.
"""

import functools
import hashlib
import json
import re

MAX_NAME_LENGTH = 63
HASH_LENGTH = 8
# Service names are DNS-1035 labels: they must start with a letter.
SERVICE_NAME_PREFIX = "pd-"
# The words that end the PDDeployment's part of a child name.
SUFFIX_WORDS = frozenset({"prefill", "decode", "router"})


def bounded_name(full: str) -> str:
    """`full` when it fits a DNS label, else a prefix of it and a hash of all of it."""
    if len(full) <= MAX_NAME_LENGTH:
        return full
    return _with_hash(full, full)


def _with_hash(readable: str, identity: str) -> str:
    digest = hashlib.sha256(identity.encode()).hexdigest()[:HASH_LENGTH]
    prefix = readable[: MAX_NAME_LENGTH - HASH_LENGTH - 1].rstrip("-")
    return f"{prefix}-{digest}"


def reads_one_way(pdd_name: str) -> bool:
    """Whether child names built from this PDDeployment name parse back to it alone."""
    if re.match(r"pd-[0-9]", pdd_name):
        return False
    return not SUFFIX_WORDS.intersection(pdd_name.split("-"))


def _child_name(pdd_name: str, readable: str, *parts: str) -> str:
    if reads_one_way(pdd_name):
        return bounded_name(readable)
    return _with_hash(readable, json.dumps([pdd_name, *parts]))


def _service_prefixed(full: str) -> str:
    return full if re.match(r"[a-z]", full) else SERVICE_NAME_PREFIX + full


# Cached: the autoscaler names every pool of every due object each cycle.
@functools.lru_cache(maxsize=8192)
def deployment_name(pdd_name: str, role: str, pool: str) -> str:
    """Name of a pool's Deployment (and its budget): `{pdd}-{role}-{pool}`."""
    return _child_name(pdd_name, f"{pdd_name}-{role}-{pool}", "pool", role, pool)


def service_name(pdd_name: str, role: str) -> str:
    """Name of a role's Service: `{pdd}-{role}`, prefixed `pd-` when pdd starts with a digit."""
    return _child_name(pdd_name, _service_prefixed(f"{pdd_name}-{role}"), "service", role)


def router_name(pdd_name: str) -> str:
    """Name of the router's Deployment, ServiceAccount, Role, RoleBinding, budget and HPA."""
    return _child_name(pdd_name, f"{pdd_name}-router", "router")


def endpoint_service_name(pdd_name: str) -> str:
    """Name of the PDDeployment's endpoint Service: its own name (`pd-` first when it starts with
    a digit, as a Service name must start with a letter)."""
    return _child_name(pdd_name, _service_prefixed(pdd_name), "endpoint")


def pdpool_name(pdd_name: str, role: str) -> str:
    """Name of a role's PDPool (mode External): `{pdd}-{role}`; a PDPool is no Service, so no
    `pd-` prefix."""
    return _child_name(pdd_name, f"{pdd_name}-{role}", "pdpool", role)
