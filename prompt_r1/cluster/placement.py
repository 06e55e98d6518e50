"""Ray placement groups with deadlines: the one way learner ranks and rollout engines get resources.

A placement group reserves all of a component's bundles at once (a learner group's ranks, or one
vLLM engine's tensor-parallel GPUs) so that no component starts half-placed and deadlocks a
collective. `ray.util.placement_group(...).ready()` waits forever when the cluster cannot hold
the bundles; `reserve` waits at most `timeout_s`, then removes the group and raises a
`PlacementError` that names the bundles, the resources the cluster has free, what is missing,
and the setting to change.

`reserve_groups` places several groups under one deadline (one per rollout engine: engines are
independent, so each may land on any node). Used by `prompt_r1.training` (learner ranks) and
`prompt_r1.cluster.engine_placement` (rollout actors).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from prompt_r1.core.failures import UserError

log = logging.getLogger(__name__)

Bundle = Mapping[str, float]


class PlacementError(UserError, RuntimeError):
    """Ray could not place a component's bundles within its deadline."""


def bundle_totals(bundles: Sequence[Bundle]) -> dict[str, float]:
    """Resources summed over bundles.

    >>> bundle_totals([{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}])
    {'CPU': 2.0, 'GPU': 2.0}
    """
    totals: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            totals[name] = totals.get(name, 0.0) + float(amount)
    return totals


def missing_resources(bundles: Sequence[Bundle], available: Mapping[str, float]) -> dict[str, float]:
    """What the bundles ask for beyond what is free, summed (a cluster may still fail to place
    bundles whose totals fit, when no single node holds one bundle: see `unplaceable_bundles`).

    >>> missing_resources([{"CPU": 2, "GPU": 1}] * 2, {"CPU": 8.0, "GPU": 1.0})
    {'GPU': 1.0}
    """
    return {name: amount - available.get(name, 0.0)
            for name, amount in bundle_totals(bundles).items() if amount > available.get(name, 0.0)}


def unplaceable_bundles(bundles: Sequence[Bundle], nodes: Sequence[Mapping[str, float]]) -> list[int]:
    """Indices of bundles that no single node's total resources could ever hold.

    >>> unplaceable_bundles([{"GPU": 2}, {"CPU": 1}], [{"CPU": 4.0, "GPU": 1.0}])
    [0]
    """
    return [index for index, bundle in enumerate(bundles)
            if not any(all(node.get(k, 0.0) >= float(v) for k, v in bundle.items()) for node in nodes)]


def describe(bundles: Sequence[Bundle]) -> str:
    """`2 x {CPU: 1, GPU: 1}` for equal bundles, else each listed.

    >>> describe([{"CPU": 1.0, "GPU": 1.0}] * 2)
    '2 x {CPU: 1, GPU: 1}'
    """
    shown = ["{" + ", ".join(f"{k}: {float(v):g}" for k, v in sorted(b.items())) + "}" for b in bundles]
    return f"{len(shown)} x {shown[0]}" if shown and len(set(shown)) == 1 else ", ".join(shown)


def reserve(bundles: Sequence[Bundle], *, what: str, timeout_s: float, field: str, fix: str,
            strategy: str = "PACK", name: str = "", fixed_cluster: bool = False) -> PlacementGroup:
    """A ready placement group for `bundles`, or `PlacementError` within `timeout_s`.

    `what` names the component ("the learner group"), `field` the deadline's config key and `fix`
    the settings that would make it fit. Zero-valued resources are dropped (Ray rejects them).
    `fixed_cluster`: the cluster never grows (a local Ray instance), so bundles beyond its total
    resources fail at once instead of at the deadline."""
    return reserve_groups([bundles], what=what, timeout_s=timeout_s, field=field, fix=fix, strategy=strategy,
                          name=name, fixed_cluster=fixed_cluster)[0]


def reserve_groups(groups: Sequence[Sequence[Bundle]], *, what: str, timeout_s: float, field: str, fix: str,
                   strategy: str = "PACK", name: str = "", fixed_cluster: bool = False) -> list[PlacementGroup]:
    """Several placement groups (e.g. one per rollout engine) placed under one deadline, or
    `PlacementError`; `reserve` for each group. All are asked for at once, so Ray places them in
    parallel and the wait is `timeout_s` in all, not per group; on failure (also Ctrl-C while
    waiting) every group is removed again, so no half-placed component keeps resources."""
    cleaned_groups = [[{k: float(v) for k, v in b.items() if float(v) > 0} or {"CPU": 0.001} for b in bundles]
                      for bundles in groups]
    cleaned = [bundle for bundles in cleaned_groups for bundle in bundles]
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    never = unplaceable_bundles(cleaned, nodes)
    if never and strategy in ("PACK", "SPREAD", "STRICT_SPREAD"):
        raise PlacementError(
            f"{what} asks for {describe(cleaned)}, but no node of this Ray cluster can hold bundle "
            f"{never[0]} ({describe([cleaned[never[0]]])}; the largest node has "
            f"{_largest_node(nodes)}); {fix}")
    total = ray.cluster_resources()
    beyond = missing_resources(cleaned, total)
    if fixed_cluster and beyond:
        raise PlacementError(
            f"{what} asks for {describe(cleaned)} = {_fmt(bundle_totals(cleaned))}, but this Ray instance has "
            f"{_fmt(total)} in all and never grows; missing: {_amounts(beyond)}. {fix}")
    placed = [placement_group(bundles, strategy=strategy, name=f"{name}-{i}" if name and len(groups) > 1 else name)
              for i, bundles in enumerate(cleaned_groups)]
    try:
        refs = [group.ready() for group in placed]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            waiting = [b for ref, bundles in zip(refs, cleaned_groups) if ref not in ready for b in bundles]
            free = ray.available_resources()  # before removal: the placed groups still hold theirs
            available = {key: free.get(key, 0.0) for key in total} | free  # Ray leaves out what is all taken
            missing = missing_resources(waiting, available)
            lacking = (_amounts(missing) if missing
                       else "no total, but no node has a bundle's worth free (fragmented)")
            raise PlacementError(
                f"{what} could not be placed within {timeout_s:g}s ({field}): it asks for {describe(cleaned)} "
                f"({strategy}{f', {len(placed)} groups, {len(ready)} placed' if len(placed) > 1 else ''}); "
                f"the cluster has {_fmt(available)} free of {_fmt(total)}; missing: {lacking}. {fix}")
    except BaseException:
        for group in placed:
            release(group)
        raise
    log.info("placed %s: %s (%s%s)", what, describe(cleaned), strategy,
             f", {len(placed)} groups" if len(placed) > 1 else "")
    return placed


def in_group(group: PlacementGroup, bundle_index: int) -> PlacementGroupSchedulingStrategy:
    """The scheduling strategy that puts an actor into one bundle of `group`."""
    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=bundle_index,
                                            placement_group_capture_child_tasks=True)


def release(group: PlacementGroup | None) -> None:
    """Give a group's resources back (after its actors are killed); safe on None."""
    if group is not None:
        try:
            remove_placement_group(group)
        except Exception as err:  # the cluster may already be gone at shutdown
            log.debug("removing placement group: %s", err)


def _largest_node(nodes: Sequence[Mapping[str, float]]) -> str:
    if not nodes:
        return "no live node"
    best = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)))
    return _fmt({k: v for k, v in best.items() if k in ("CPU", "GPU")})


def _amounts(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in sorted(resources.items()))


def _fmt(resources: Mapping[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU") or k.startswith("accelerator")}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) + "}"
