"""A strategic-merge patch of a pod template, as `kubectl patch --type strategic` applies one.

Only the pod-template shapes a pool's `template.patch` uses: objects merge key by key and a null
removes a key; the lists that core/v1 gives a patch merge key (`patchMergeKey`: containers,
volumes and env by name, volumeMounts by mountPath, ports by containerPort, ...) merge entry by
entry, an entry of the patch updating ours with the same key and the others appended; every other
list is replaced whole. Volumes also retain keys as core/v1 says (`retainKeys`): a patched volume
keeps only the fields the patch names, so a new source replaces the old one. Directives
(`$patch`, `$retainKeys`) are refused by the API before a patch gets here.
"""

import copy
from collections.abc import Mapping
from typing import Any

# core/v1's patchMergeKey of the pod template's mergeable lists, by field name (each name means
# one list wherever it appears in a pod template).
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "schedulingGates": "name",
}
# Lists whose entries keep only the keys the patch names (core/v1 `patchStrategy: retainKeys`).
RETAIN_KEYS = frozenset({"volumes"})


def strategic_merge(ours: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`ours` with `patch` merged in; neither is changed."""
    merged = copy.deepcopy(dict(ours))
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping):
            current = merged.get(key)
            merged[key] = strategic_merge(current if isinstance(current, Mapping) else {}, value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(merged.get(key), list):
            merged[key] = _merge_list(merged[key], value, MERGE_KEYS[key], key in RETAIN_KEYS)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_list(ours: list[Any], patch: list[Any], key: str, retain: bool) -> list[Any]:
    merged = copy.deepcopy(ours)
    for entry in patch:
        if not isinstance(entry, Mapping) or key not in entry:
            # Not addressable: appended as written, for the apiserver to judge.
            merged.append(copy.deepcopy(entry))
            continue
        index = next(
            (
                i
                for i, item in enumerate(merged)
                if isinstance(item, Mapping) and item.get(key) == entry[key]
            ),
            None,
        )
        if index is None:
            merged.append(strategic_merge({}, entry))
            continue
        base = merged[index]
        if retain:
            base = {name: value for name, value in base.items() if name in entry}
        merged[index] = strategic_merge(base, entry)
    return merged
