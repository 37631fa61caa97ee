"""Placement of worker groups: the pure plan (what fits a cluster, bundle order), and real Ray
clusters that advertise GPUs, where colocated groups share each rank's GPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from corerl.distributed.placement import (
    CPU_BUNDLE,
    ClusterView,
    NodeResources,
    PoolLayout,
    check_fits,
    pool_bundles,
    ranks_by_node,
)
from corerl.errors import ConfigError
from tests.conftest import clean_env

ONE_GPU = ClusterView([NodeResources("a", cpus=16, gpus=1)])
CPUS_ONLY = ClusterView([NodeResources("a", cpus=2, gpus=0)])
TWO_BY_FOUR = ClusterView([NodeResources("a", 16, 4), NodeResources("b", 16, 4)])


def test_cpu_clusters_take_cpu_ranks_with_a_token_reservation():
    layout = PoolLayout("colocated", 1, 4)
    check_fits(layout, 4, "training worker", CPUS_ONLY)  # four CPU ranks on two cores: fine
    bundles, strategy = pool_bundles(layout, CPUS_ONLY)
    assert bundles == [{"CPU": CPU_BUNDLE}] * 4 and strategy == "STRICT_PACK"


def test_gpu_clusters_take_a_whole_gpu_per_rank_slot():
    bundles, strategy = pool_bundles(PoolLayout("colocated", 2, 4), TWO_BY_FOUR)
    assert bundles == [{"GPU": 1.0}] * 8 and strategy == "SPREAD"


def test_two_ranks_on_one_gpu_are_refused_in_one_line_naming_the_key():
    with pytest.raises(ConfigError) as caught:
        check_fits(PoolLayout("colocated", 1, 2), 2, "training worker", ONE_GPU)
    assert str(caught.value).startswith(
        "cluster.gpus_per_node: 2 ranks (1 node(s) x 2) need a GPU each, but the Ray cluster has 1 node, 1 GPU, "
        "16 CPUs; two ranks of one group cannot share a GPU")
    assert "\n" not in str(caught.value)


def test_a_gpu_asked_of_a_cpu_cluster_is_refused():
    layout = PoolLayout("generation", 1, 1, key="policy.generation.colocated.resources.gpus_per_node", use_gpus=True)
    with pytest.raises(ConfigError, match="generation engines ask for a GPU each but the Ray cluster has none"):
        check_fits(layout, 1, "generation engine", CPUS_ONLY)


def test_nodes_too_small_for_the_per_node_layout_are_refused():
    with pytest.raises(ConfigError, match=r"1 node\(s\) with 8 GPUs each are asked for, but only 0 node"):
        check_fits(PoolLayout("colocated", 1, 8), 8, "training worker", TWO_BY_FOUR)


def test_a_group_larger_than_its_pool_is_refused():
    with pytest.raises(ConfigError, match="3 training workers do not fit the 2 rank slots"):
        check_fits(PoolLayout("colocated", 1, 2), 3, "training worker", CPUS_ONLY)


def test_ranks_of_one_node_stay_contiguous():
    assert ranks_by_node({0: "a", 1: "b", 2: "a", 3: "b"}) == [0, 2, 1, 3]
    assert ranks_by_node({0: "b", 1: "b", 2: "a"}) == [0, 1, 2]


SHARED_GPUS = textwrap.dedent(
    """
    import json, time, ray
    from corerl.config.schema import ClusterConfig, ResourcesConfig
    from corerl.distributed import placement
    from corerl.distributed.placement import dedicated_generation_layout, training_layout
    from corerl.distributed.worker_group import RayWorkerGroup
    from corerl.errors import ConfigError
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False)  # Ray advertises two GPUs; the ranks use gloo
    probe = "corerl.testing.workers:ProbeWorker"
    layout = training_layout(ClusterConfig(gpus_per_node=2))
    policy = RayWorkerGroup(probe, 2, layout=layout, role="training worker")
    reference = RayWorkerGroup(probe, 2, layout=layout, role="reference worker")
    engine = RayWorkerGroup(probe, 1, layout=layout, role="generation engine")
    second_engine = RayWorkerGroup(probe, 1, layout=layout, role="generation engine")
    out = {name: group.call("placement") for name, group in
           [("policy", policy), ("reference", reference), ("engine", engine), ("second_engine", second_engine)]}
    out["sum"] = reference.call("all_reduce_rank")
    out["refused"], out["reserved"] = [], []

    def no_pool(pool_layout, cluster, timeout):  # a refusal comes before a pool is reserved and waited on
        out["reserved"].append(pool_layout.name)
        raise AssertionError(f"a pool was reserved for {pool_layout.name!r} (it would wait {timeout:.0f} s)")

    placement.Pool = no_pool
    for size, group_layout in [(3, layout), (1, dedicated_generation_layout(ResourcesConfig(gpus_per_node=1)))]:
        try:
            RayWorkerGroup(probe, size, layout=group_layout, role="training worker")
        except ConfigError as exc:
            out["refused"].append(str(exc))
    for group in (policy, reference, engine, second_engine):
        group.shutdown()
    deadline = time.monotonic() + 120  # Ray returns a removed placement group's resources asynchronously (a hang guard)
    while ray.available_resources().get("GPU") != 2.0 and time.monotonic() < deadline:
        time.sleep(0.2)
    out["left"] = ray.available_resources().get("GPU")
    print("RESULT", json.dumps(out))
    """
)


@pytest.mark.slow
def test_colocated_groups_share_each_ranks_gpu_on_a_cluster_with_gpus():
    proc = subprocess.run([sys.executable, "-c", SHARED_GPUS], capture_output=True, text=True, timeout=400,
                          env=clean_env({"RAY_ADDRESS": ""}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    policy = [rank["gpus"] for rank in out["policy"]]
    assert sorted(policy) == [["0"], ["1"]]  # one whole GPU per rank, never the same one twice
    assert [rank["visible"] for rank in out["policy"]] == [g[0] for g in policy]  # bound by the bundle
    assert [rank["gpus"] for rank in out["reference"]] == policy  # the reference shares rank by rank
    assert out["engine"][0]["gpus"] == out["second_engine"][0]["gpus"] == policy[0]  # engines share rank 0's
    assert out["sum"] == [1, 1]
    too_many, no_room = out["refused"]
    assert too_many.startswith("cluster.gpus_per_node: 3 training workers do not fit the 2 rank slots")
    assert no_room.startswith("policy.generation.colocated.resources.gpus_per_node: the 'generation' pool needs "
                              "1 GPUs of its own but 0 of the cluster's 2 are free: this run holds 'colocated' (2 GPUs)")
    assert out["reserved"] == []  # refused before anything was reserved, not after a wait for GPUs
    assert out["left"] == 2.0  # the last group out gave the pool back
