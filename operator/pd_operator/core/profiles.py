"""The profiles a PDDeployment names: its model's, and each pool's accelerator's.

The model's lookup by name, which `core.resolved` runs once per generation for the rules that
seed from the performance model (`core.learning`), and the list of profile names that match
none, which the operator reports (a condition and an event) instead of silently learning
online.
"""

from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.hardware import HARDWARE_PROFILES, MODEL_PROFILES, ModelProfile


def model_profile_for(model_name: str) -> ModelProfile | None:
    """The model profile whose name is the model's last path component, case-insensitively."""
    return MODEL_PROFILES.get(model_name.rstrip("/").rsplit("/", 1)[-1].lower())


def unknown_profiles(spec: PDDeploymentSpec) -> list[str]:
    """One line per `accelerator.profile` that names no hardware profile: where, and the
    names that exist."""
    known = ", ".join(sorted(HARDWARE_PROFILES))
    return [
        f"spec.{role}.pools[{index}].accelerator.profile {pool.accelerator.profile!r} matches "
        f"no hardware profile (known: {known}); its capacity is learned online from traffic"
        for role in ("prefill", "decode")
        for index, pool in enumerate(spec.pools(role))
        if pool.accelerator.profile and pool.accelerator.profile not in HARDWARE_PROFILES
    ]
