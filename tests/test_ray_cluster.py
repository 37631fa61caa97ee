"""Worker groups on Ray clusters started here (loopback only): joining the cluster named by
RAY_ADDRESS instead of starting one (this test worker's shared head, which every run of the suite
joins: tests/ray_nodes.py), and a recipe whose ranks spread over two nodes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import CORERL, REPO, clean_env
from tests.ray_nodes import ray_cluster, ray_env

CLIENT = textwrap.dedent(
    """
    import ray
    from corerl.distributed.worker_group import RayWorkerGroup
    group = RayWorkerGroup("corerl.testing.workers:ProbeWorker", 2)
    print("SUM", group.call("all_reduce_rank"))
    print("VARIABLE", group.call("variable", "CORERL_PROBE"))
    print("GCS", ray.get_runtime_context().gcs_address)
    group.shutdown()
    """
)


def test_worker_group_uses_the_cluster_at_ray_address():
    env = clean_env({"CORERL_PROBE": "seen"})
    proc = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SUM [1, 1]" in proc.stdout
    gcs = next(line for line in proc.stdout.splitlines() if line.startswith("GCS "))
    assert gcs.endswith(env["RAY_ADDRESS"].split(":")[1]), gcs  # the existing cluster, not a new local runtime
    # the cluster's workers inherit its environment, not this client's: corerl hands its variables over
    assert "VARIABLE ['seen', 'seen']" in proc.stdout


@pytest.mark.slow
def test_the_demo_recipe_runs_with_its_ranks_spread_over_two_ray_nodes(tmp_path):
    with ray_cluster(tmp_path, nodes=2, cpus_per_node=1) as address:
        proc = subprocess.run(
            [str(CORERL), "run", "cluster.num_nodes=2", "cluster.gpus_per_node=1", "policy.generation.backend=hf",
             "sft.max_steps=3", "algorithm.max_steps=3", "algorithm.kl_penalty=0.05", "algorithm.batch_size=4",
             "algorithm.num_generations_per_prompt=4", f"run.output_dir={tmp_path}",
             "run.name=two-nodes"],
            capture_output=True, text=True, env={**ray_env(), "RAY_ADDRESS": address}, timeout=400, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # the policy and the KL reference: each rank of each group on its own node
    assert out.count("dtensor: 2 rank(s) on 2 Ray node(s)") == 2, out[-3000:]
    assert (tmp_path / "two-nodes" / "final" / "config.json").exists()
