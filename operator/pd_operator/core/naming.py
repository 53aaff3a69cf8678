"""Deterministic, DNS-valid names of a PDDeployment's children.

Children are named from the parent and the pool, so a reconcile finds the same objects again
without bookkeeping. Names longer than a DNS label are cut and given a hash of the full name,
which keeps them unique and stable across reconciles and operator versions.

The scheme concatenates names with '-', so two PDDeployments in one namespace can still ask for
the same child name (`a` with pool `b-prefill-c` and `a-prefill-b` with pool `c`); the owner
reference makes the second one fail to take over the first one's child instead of sharing it.
"""

import hashlib
import re

MAX_NAME_LENGTH = 63
HASH_LENGTH = 8
# Service names are DNS-1035 labels: they must start with a letter.
SERVICE_NAME_PREFIX = "pd-"


def bounded_name(full: str) -> str:
    """`full` when it fits a DNS label, else a prefix of it and a hash of all of it."""
    if len(full) <= MAX_NAME_LENGTH:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:HASH_LENGTH]
    prefix = full[: MAX_NAME_LENGTH - HASH_LENGTH - 1].rstrip("-")
    return f"{prefix}-{digest}"


def deployment_name(pdd_name: str, role: str, pool: str) -> str:
    """Name of a pool's Deployment: `{pdd}-{role}-{pool}`."""
    return bounded_name(f"{pdd_name}-{role}-{pool}")


def service_name(pdd_name: str, role: str) -> str:
    """Name of a role's Service: `{pdd}-{role}`, prefixed `pd-` when pdd starts with a digit."""
    full = f"{pdd_name}-{role}"
    if not re.match(r"[a-z]", full):
        full = SERVICE_NAME_PREFIX + full
    return bounded_name(full)


def endpoint_service_name(pdd_name: str) -> str:
    """Name of the PDDeployment's endpoint Service: its own name (`pd-` first when it starts with
    a digit, as a Service name must start with a letter)."""
    full = pdd_name if re.match(r"[a-z]", pdd_name) else SERVICE_NAME_PREFIX + pdd_name
    return bounded_name(full)
