"""Leader election on a coordination.k8s.io/v1 Lease, as Kubernetes' own controllers do it.

One operator replica holds the Lease and runs the reconcile workers and the autoscaler; the
others watch (their caches stay warm) and wait. The holder renews the Lease every `retry`
seconds. A Lease is taken over when its record has not changed for `duration` seconds of the
*observer's* clock (the holder's renewTime is not compared with the local clock: nodes' clocks
drift). Every write carries the resourceVersion it read, so two candidates cannot both win.
A holder that shuts down cleanly releases the Lease, and a standby takes it within `retry`.
"""

import datetime
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pd_operator.adapters.kube import call_json

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


@dataclass(frozen=True)
class LeaseTiming:
    """controller-runtime's defaults: 15 s lease, 10 s renew deadline, 2 s retry."""

    duration: float = 15.0  # a record unchanged this long has no live holder
    renew_deadline: float = 10.0  # a holder that could not renew for this long steps down
    retry: float = 2.0  # between attempts to take or renew


def _micro_time(unix_seconds: float) -> str:
    """metav1.MicroTime."""
    stamp = datetime.datetime.fromtimestamp(unix_seconds, datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderLease:
    """One candidate for one Lease."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
    ) -> None:
        self.api_client = api_client
        self.path = LEASES.format(namespace=namespace)
        self.name, self.identity = name, identity
        self.timing = timing or LeaseTiming()
        # The record last read and when (monotonic) it was first seen as it is.
        self._seen: tuple[str, float] | None = None

    def try_acquire_or_renew(self) -> bool:
        """Take the Lease if it is free or expired, or renew it if held: True when held after
        this call. Never raises for a lost race or an unreachable apiserver (False)."""
        try:
            lease = call_json(self.api_client, "GET", f"{self.path}/{self.name}", None)
        except ApiException as error:
            if error.status != 404:
                return False
            return self._write("POST", self.path, self._record(None))
        except OSError:
            return False
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        now = time.monotonic()
        version = str(lease["metadata"].get("resourceVersion"))
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)
        duration = float(spec.get("leaseDurationSeconds") or self.timing.duration)
        free = not holder or now - self._seen[1] >= duration
        if holder != self.identity and not free:
            return False
        return self._write("PUT", f"{self.path}/{self.name}", self._record(lease))

    def release(self) -> None:
        """Give the Lease up if this candidate holds it, so that a standby takes it at once."""
        try:
            lease = call_json(self.api_client, "GET", f"{self.path}/{self.name}", None)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"] = {**lease["spec"], "holderIdentity": None}
            call_json(self.api_client, "PUT", f"{self.path}/{self.name}", lease)
        except (ApiException, OSError):
            pass  # it expires by itself

    def _record(self, lease: dict[str, Any] | None) -> dict[str, Any]:
        now = _micro_time(time.time())
        spec = (lease or {}).get("spec") or {}
        taken = spec.get("holderIdentity") != self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (1 if lease and taken else 0)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": (lease or {}).get("metadata") or {"name": self.name},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": round(self.timing.duration),
                "acquireTime": now if taken else spec.get("acquireTime", now),
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def _write(self, method: str, path: str, record: dict[str, Any]) -> bool:
        try:
            written = call_json(self.api_client, method, path, record)
        except (ApiException, OSError):
            return False  # 409: another candidate wrote first
        self._seen = (str(written["metadata"].get("resourceVersion")), time.monotonic())
        return True
