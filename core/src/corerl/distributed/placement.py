"""Where the ranks of a worker group run: Ray placement groups shared by colocated groups.

Every Ray worker group asks a *pool* for its ranks. A pool is one Ray placement group with a
bundle per rank slot (``num_nodes x per_node``): a whole GPU each on a cluster with GPUs, a
token share of a CPU on a cluster without. Groups that name the same pool share its bundles:
rank ``r`` of the policy, of the frozen KL reference and of a colocated generation engine all
run in bundle ``r``, on the same GPU, each actor asking for :data:`GPU_SHARE` of it. Ray then
sets ``CUDA_VISIBLE_DEVICES`` of each actor to its bundle's GPU, so a rank's device is the one
its bundle got (``cuda:0`` as the actor sees it), never a guess from its rank number.

Requests a cluster can never satisfy are refused before anything is reserved, in one line that
names the config key and what the cluster has (:func:`check_fits`): they never wait out
``CORERL_WORKER_START_TIMEOUT``. Two ranks of one group never share a GPU (NCCL refuses a
communicator with a duplicate GPU), so a group needs as many GPUs as it has ranks.

The plan (:func:`check_fits`, :func:`pool_bundles`, :func:`ranks_by_node`) is pure and tested
without Ray; :class:`PoolRegistry` is the thin part that talks to Ray.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from corerl.errors import ConfigError, CorerlError

log = logging.getLogger(__name__)

#: What one actor asks of its bundle's GPU: up to ten colocated groups share one GPU.
GPU_SHARE = 0.1
#: What a CPU-only bundle reserves: a token, so that a pool never starves a small machine
#: (CPU ranks set their own thread counts) while Ray still places the bundles on nodes.
CPU_BUNDLE = 0.01
#: The pool colocated groups share (policy, reference, colocated generation).
COLOCATED = "colocated"


def start_timeout_s() -> float:
    """How long a group may take to start: its pool's reservation, then its ranks
    (``CORERL_WORKER_START_TIMEOUT``, 300 s)."""
    return float(os.environ.get("CORERL_WORKER_START_TIMEOUT", "300"))


@dataclass(frozen=True)
class NodeResources:
    """What one alive Ray node offers."""

    node_id: str
    cpus: float
    gpus: float


@dataclass(frozen=True)
class PoolLayout:
    """A pool's shape and how it uses devices.

    ``key`` is the config key path that sets the layout (named in errors); ``use_gpus`` None
    means GPUs when the cluster has any, else CPU ranks; ``without_gpus`` is what to do instead
    where the cluster has none (said in the error).
    """

    name: str
    num_nodes: int
    per_node: int
    key: str = "cluster.gpus_per_node"
    use_gpus: bool | None = None
    without_gpus: str = "run on a cluster with GPUs"

    @property
    def size(self) -> int:
        return self.num_nodes * self.per_node


@dataclass
class ClusterView:
    """The alive nodes of a Ray cluster (from ``ray.nodes()``)."""

    nodes: list[NodeResources] = field(default_factory=list)

    @classmethod
    def from_ray(cls) -> ClusterView:
        import ray

        return cls([
            NodeResources(n["NodeID"], float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)))
            for n in ray.nodes() if n.get("Alive")
        ])

    @classmethod
    def local(cls) -> ClusterView | None:
        """The runtime a run would start on this machine, as Ray's own GPU detection sees it, without
        starting Ray (about 0.5 s instead of 5); None where a running Ray runtime or a change in Ray's
        internal detector API means asking Ray itself."""
        import ray

        if ray.is_initialized():
            return None
        try:
            from ray._private.accelerators import get_accelerator_manager_for_resource

            gpus = get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators()
        except (ImportError, AttributeError) as exc:  # a Ray release that moved it: ask a started runtime
            log.debug("Ray's GPU detector is not where it was: %s", exc)
            return None
        return cls([NodeResources("local", float(os.cpu_count() or 1), float(gpus))])

    @property
    def gpus(self) -> int:
        return int(sum(n.gpus for n in self.nodes))

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    def describe(self) -> str:
        nodes = len(self.nodes)
        return f"{nodes} node{'s' if nodes != 1 else ''}, {self.gpus} GPU{'s' if self.gpus != 1 else ''}, {self.cpus:g} CPUs"


def uses_gpus(layout: PoolLayout, cluster: ClusterView) -> bool:
    """Whether the pool's ranks run on GPUs: as asked, else whenever the cluster has any."""
    return layout.use_gpus if layout.use_gpus is not None else cluster.gpus > 0


def check_fits(layout: PoolLayout, world_size: int, role: str, cluster: ClusterView) -> None:
    """Refuse, in one line, a request this cluster can never satisfy (pure: no Ray calls)."""
    if world_size > layout.size:
        raise ConfigError(
            f"{world_size} {role}s do not fit the {layout.size} rank slots of the {layout.name!r} pool",
            key=layout.key, hint="give the group no more ranks than the cluster layout has",
        )
    if not uses_gpus(layout, cluster):
        return
    if cluster.gpus == 0:
        raise ConfigError(
            f"the {role}s ask for a GPU each but the Ray cluster has none ({cluster.describe()})",
            key=layout.key, hint=layout.without_gpus,
        )
    if layout.size > cluster.gpus:
        raise ConfigError(
            f"{layout.size} ranks ({layout.num_nodes} node(s) x {layout.per_node}) need a GPU each, but the Ray "
            f"cluster has {cluster.describe()}; two ranks of one group cannot share a GPU (NCCL refuses it)",
            key=layout.key, hint=f"ask for at most {cluster.gpus} ranks, or add GPUs to the cluster",
        )
    roomy = [n for n in cluster.nodes if n.gpus >= layout.per_node]
    if len(roomy) < layout.num_nodes:
        raise ConfigError(
            f"{layout.num_nodes} node(s) with {layout.per_node} GPUs each are asked for, but only {len(roomy)} node(s) "
            f"of the Ray cluster ({cluster.describe()}) have that many",
            key=layout.key, hint="lower the GPUs per node or the node count to what the cluster has",
        )


def pool_bundles(layout: PoolLayout, cluster: ClusterView) -> tuple[list[dict[str, float]], str]:
    """The placement group's bundles (one per rank slot) and its strategy."""
    bundle = {"GPU": 1.0} if uses_gpus(layout, cluster) else {"CPU": CPU_BUNDLE}
    strategy = "STRICT_PACK" if layout.num_nodes == 1 else "SPREAD"
    return [dict(bundle) for _ in range(layout.size)], strategy


def ranks_by_node(bundle_nodes: dict[int, str]) -> list[int]:
    """Bundle indices in rank order: ranks of one node stay contiguous (tensor-parallel groups
    are cut from neighbouring ranks), nodes in the order their first bundle appears."""
    first_seen: dict[str, int] = {}
    for index in sorted(bundle_nodes):
        first_seen.setdefault(bundle_nodes[index], index)
    return sorted(bundle_nodes, key=lambda index: (first_seen[bundle_nodes[index]], index))


class Pool:
    """One Ray placement group and the rank order of its bundles; shared by reference count."""

    def __init__(self, layout: PoolLayout, cluster: ClusterView, timeout: float) -> None:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        self.layout = layout
        self.gpus = uses_gpus(layout, cluster)
        bundles, strategy = pool_bundles(layout, cluster)
        self.group = placement_group(bundles, strategy=strategy)
        try:
            ray.get(self.group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self.remove()
            raise CorerlError(
                f"Ray could not reserve the {layout.name!r} pool ({len(bundles)} x {bundles[0]}) within {timeout:.0f} s; "
                f"free now: {_free()}", key=layout.key,
                hint="free the GPUs other runs hold, or raise CORERL_WORKER_START_TIMEOUT",
            ) from None
        self.bundle_nodes = {int(k): v for k, v in placement_group_table(self.group)["bundles_to_node_id"].items()}
        self.order = ranks_by_node(self.bundle_nodes)
        self.users = 0

    def actor_options(self, rank: int) -> dict[str, Any]:
        """Ray options that put rank ``rank`` of a group into its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.order[rank],
            placement_group_capture_child_tasks=False,
        )
        return {"num_cpus": 0, "num_gpus": GPU_SHARE if self.gpus else 0, "scheduling_strategy": strategy}

    def node_of(self, rank: int) -> str:
        return self.bundle_nodes[self.order[rank]]

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(self.group)
        except Exception as exc:  # Ray already shut down: nothing is held any more
            log.debug("remove_placement_group: %s", exc)


def _free() -> str:
    import ray

    free = ray.available_resources()
    return f"{free.get('CPU', 0):g} CPU, {free.get('GPU', 0):g} GPU"


class PoolRegistry:
    """The pools of this driver's Ray session, by layout; a pool lives while a group uses it."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, PoolLayout], Pool] = {}
        self._lock = threading.Lock()
        #: seconds a request waits for the cluster to fit it (a recovery after a node died:
        #: ``run.restart_wait_s``); 0: a request that does not fit is refused at once
        self.wait_s = 0.0

    def acquire(self, layout: PoolLayout, world_size: int, role: str) -> Pool:
        """The pool for ``layout`` (reserved now if no live group holds it), checked to fit."""
        import ray

        cluster = self._cluster_that_fits(layout, world_size, role)
        key = (ray.get_runtime_context().get_job_id(), layout)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                self._check_not_blocked_by_own_pools(layout, cluster)
                timeout = max(start_timeout_s(), self.wait_s)
                pool = self._pools[key] = Pool(layout, cluster, timeout)
            pool.users += 1
            return pool

    def _cluster_that_fits(self, layout: PoolLayout, world_size: int, role: str) -> ClusterView:
        """The cluster as Ray sees it, once it fits the request: at once, or within :attr:`wait_s`
        (nodes joining after one died); else the one-line refusal of :func:`check_fits`."""
        deadline = time.monotonic() + self.wait_s
        while True:
            cluster = ClusterView.from_ray()
            try:
                check_fits(layout, world_size, role, cluster)
                return cluster
            except ConfigError as exc:
                if time.monotonic() >= deadline:
                    raise
                log.warning("waiting up to %.0f s (run.restart_wait_s) for the Ray cluster to hold the %r pool again: %s",
                            deadline - time.monotonic(), layout.name, exc.message)
                time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))

    def _check_not_blocked_by_own_pools(self, layout: PoolLayout, cluster: ClusterView) -> None:
        """A new GPU pool that this driver's own pools leave no room for would wait forever."""
        import ray

        if not uses_gpus(layout, cluster):
            return
        free = ray.available_resources().get("GPU", 0)
        held = {f"{p.layout.name!r} ({p.layout.size} GPUs)" for p in self._pools.values() if p.gpus}
        if free < layout.size and held:
            raise ConfigError(
                f"the {layout.name!r} pool needs {layout.size} GPUs of its own but {free:g} of the cluster's "
                f"{cluster.gpus} are free: this run holds {', '.join(sorted(held))}",
                key=layout.key, hint="colocate the group with the others, or give the cluster more GPUs",
            )

    def release(self, pool: Pool) -> None:
        """One group fewer uses ``pool``; the last one gives its reservation back."""
        with self._lock:
            pool.users -= 1
            if pool.users > 0:
                return
            for key, held in list(self._pools.items()):
                if held is pool:
                    del self._pools[key]
        pool.remove()


#: This driver's pools.
POOLS = PoolRegistry()


def training_layout(cluster: Any, pool: str = COLOCATED) -> PoolLayout:
    """The pool of a training backend's ranks: ``cluster.num_nodes x cluster.gpus_per_node``
    slots, the run's colocated pool unless ``pool`` (a config's ``Config.pool``: a frozen model
    with ranks of its own) names another."""
    return PoolLayout(pool, cluster.num_nodes, cluster.gpus_per_node)


def dedicated_generation_layout(resources: Any) -> PoolLayout:
    """The pool of dedicated generation (``policy.generation.colocated.enabled=false``): GPUs of its own."""
    return PoolLayout("generation", resources.num_nodes or 1, resources.gpus_per_node,
                      key="policy.generation.colocated.resources.gpus_per_node", use_gpus=True,
                      without_gpus="run on a cluster with GPUs, or colocate generation with training "
                                   "(policy.generation.colocated.enabled=true)")


def async_generation_layout(resources: Any) -> PoolLayout:
    """The pool of asynchronous RL's generation worker: GPUs of its own on a cluster with GPUs,
    else a CPU process of its own (:mod:`corerl.asynchronous.engine`)."""
    return PoolLayout("generation", resources.num_nodes or 1, resources.gpus_per_node or 1,
                      key="policy.generation.colocated.resources.gpus_per_node")
