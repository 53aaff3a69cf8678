"""The profiles a PDDeployment names: its model's, and each pool's accelerator's.

One lookup for every rule that seeds from the performance model (`core.learning`), and the
list of profile names that match none, which the operator reports (a condition and an event)
instead of silently learning online.
"""

from pd_operator.api.spec import PDDeploymentSpec, PoolSpec
from pd_operator.core.hardware import (
    HARDWARE_PROFILES,
    MODEL_PROFILES,
    HardwareProfile,
    ModelProfile,
)


def model_profile_for(model_name: str) -> ModelProfile | None:
    """The model profile whose name is the model's last path component, case-insensitively."""
    return MODEL_PROFILES.get(model_name.rstrip("/").rsplit("/", 1)[-1].lower())


def pool_profiles(
    spec: PDDeploymentSpec, pool: PoolSpec
) -> tuple[HardwareProfile, ModelProfile] | None:
    """The pool's card and the model, when both have a profile; None: learn online."""
    hardware = HARDWARE_PROFILES.get(pool.accelerator.profile or "")
    model = model_profile_for(spec.model.name)
    if hardware is None or model is None:
        return None
    return hardware, model


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
