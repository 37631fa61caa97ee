"""Worker groups: real Ray actors forming a real gloo group; failures name the rank."""

from __future__ import annotations

import pytest

from corerl.config.schema import ResourcesConfig
from corerl.distributed.placement import dedicated_generation_layout
from corerl.distributed.worker_group import LocalWorkerGroup, RayWorkerGroup, WorkerFailed
from corerl.errors import ConfigError

PROBE = "corerl.testing.workers:ProbeWorker"


def test_two_ray_ranks_form_a_process_group_and_calls_return_by_rank():
    group = RayWorkerGroup(PROBE, 2, tag="t")
    try:
        assert group.call("all_reduce_rank") == [1, 1]
        assert group.call("echo", "x") == [(0, "t", "x"), (1, "t", "x")]
        assert group.call_per_rank("echo", [("a",), ("b",)]) == [(0, "t", "a"), (1, "t", "b")]
        assert len(set(group.pids())) == 2
    finally:
        group.shutdown()


def test_on_one_machine_the_rendezvous_store_and_gloo_listen_on_loopback_only():
    group = RayWorkerGroup(PROBE, 2)
    try:
        assert group.call("all_reduce_rank") == [1, 1]
        port = group.call("rendezvous_port")[0]
        listening = group.call("listening")
        assert {ip for ip, p in listening[0] if p == port} == {"127.0.0.1"}, listening  # rank 0's TCPStore
        for rank_sockets in listening:
            # what is left is Ray's own core-worker server (on every interface in Ray 2.60: docs/security.md)
            assert len([ip for ip, _ in rank_sockets if ip not in ("127.0.0.1", "::1")]) <= 1, listening
    finally:
        group.shutdown()


def test_a_rank_that_raises_ends_the_group_and_is_named():
    group = RayWorkerGroup(PROBE, 2)
    with pytest.raises(WorkerFailed) as caught:
        group.call("fail_on", 1)
    assert str(caught.value).startswith("worker rank 1 (pid ")
    assert "raised ValueError: rank 1 refuses during 'fail_on'" in str(caught.value)
    with pytest.raises(WorkerFailed, match="shut down after an earlier failure"):
        group.call("echo", 1)


def test_a_rank_that_fails_to_start_ends_the_start_at_once_and_is_named(monkeypatch):
    # rank 0 raises before it hosts the rendezvous store: rank 1 would wait for that store until its
    # own connect timeout, and the group, until the start timeout, naming no cause
    monkeypatch.setenv("CORERL_WORKER_START_TIMEOUT", "240")
    with pytest.raises(WorkerFailed) as caught:
        RayWorkerGroup(PROBE, 2, fail_at_start=0)
    said = str(caught.value)
    assert said.startswith("worker rank 0 raised ValueError: rank 0 refuses to start during 'start'"), said
    assert (caught.value.how, caught.value.during) == ("raised", "start")  # a raise, not a fault to restart after


def test_the_rendezvous_port_is_held_from_its_probe_until_rank_0_listens_on_it():
    import errno
    import socket

    from corerl.distributed.rendezvous import loopback_listener
    from corerl.distributed.worker_group import held_port

    hold = held_port()
    port = hold.getsockname()[1]
    try:
        other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with other, pytest.raises(OSError) as taken:  # another process's socket cannot take it meanwhile
            other.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
        with loopback_listener(port) as store:  # rank 0's store can
            assert store.getsockname() == ("127.0.0.1", port)
    finally:
        hold.close()


def test_a_user_error_on_a_rank_keeps_its_type_key_and_message():
    group = RayWorkerGroup(PROBE, 2)
    with pytest.raises(ConfigError) as caught:
        group.call("fail_on", 0, user_error=True)
    assert caught.value.key == "algorithm.batch_size"
    assert caught.value.message == "the batch is wrong (on rank 0)"


def test_local_group_runs_world_size_1_in_this_process():
    import os

    group = LocalWorkerGroup(PROBE, tag="solo")
    assert group.call("echo", 3) == [(0, "solo", 3)]
    assert group.call("all_reduce_rank") == [0]
    assert group.pids() == [os.getpid()]


def test_two_cpu_groups_share_a_small_machine():
    # a policy and a KL reference model, both at world size 2, on a 2-core machine: one pool, shared
    first = RayWorkerGroup(PROBE, 2)
    try:
        second = RayWorkerGroup(PROBE, 2)
        try:
            assert second.call("all_reduce_rank") == [1, 1] and first.call("all_reduce_rank") == [1, 1]
            assert first.pool is second.pool and first.pool.users == 2
        finally:
            second.shutdown()
        assert first.pool.users == 1 and first.call("echo", 1) == [(0, "", 1), (1, "", 1)]
    finally:
        first.shutdown()


def test_a_gpu_request_on_a_gpu_less_cluster_fails_at_once_in_one_line(monkeypatch):
    from corerl.distributed import placement

    monkeypatch.setenv("CORERL_WORKER_START_TIMEOUT", "300")  # must not be waited out
    reserved = []

    def no_pool(layout, cluster, timeout):  # "at once": refused before a pool is reserved and waited on
        reserved.append(layout.name)
        raise AssertionError(f"a pool was reserved for {layout.name!r} (it would wait {timeout:.0f} s for a GPU)")

    monkeypatch.setattr(placement, "Pool", no_pool)
    layout = dedicated_generation_layout(ResourcesConfig(gpus_per_node=1))
    with pytest.raises(ConfigError) as caught:
        RayWorkerGroup(PROBE, 1, layout=layout, role="generation engine")  # this machine has no GPU
    assert reserved == []
    message = str(caught.value)
    assert message.startswith("policy.generation.colocated.resources.gpus_per_node: the generation engines ask for "
                              "a GPU each but the Ray cluster has none (1 node, 0 GPUs, ")
    assert "\n" not in message and caught.value.exit_code == 2


@pytest.mark.parametrize("how, cause", [
    ("multiline", "raised ValueError: 1 validation error for ModelConfig during 'fail_on'"),
    ("unpicklable", "raised ValueError: rank 0 refuses, unpicklably during 'fail_on'"),
], ids=["multiline", "unpicklable"])
def test_an_engine_error_from_a_rank_is_one_line_naming_the_engine_the_rank_and_the_cause(how, cause):
    group = RayWorkerGroup(PROBE, 1, role="generation engine")
    with pytest.raises(WorkerFailed) as caught:
        group.call("fail_on", 0, how=how)
    said = str(caught.value)
    assert "\n" not in said and said.startswith("generation engine rank 0 (pid ") and cause in said, said


def test_a_cluster_address_where_nothing_listens_is_refused_at_once_in_one_line(monkeypatch):
    import ray

    from corerl.distributed import worker_group
    from corerl.distributed.worker_group import check_cluster_answers, free_port

    port = free_port()  # free: nothing listens there
    with pytest.raises(ConfigError) as refused:
        check_cluster_answers(f"127.0.0.1:{port}", "RAY_ADDRESS")
    line = str(refused.value)  # refused by the connection itself, not after a connect timeout ran out
    assert line.startswith(f"RAY_ADDRESS: nothing answers at 127.0.0.1:{port} (Connection refused); start one there")
    # "at once": a run given the address never reaches Ray's own connect, which retries it for minutes
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def connect(**options):
        raise AssertionError(f"ray.init reached with {options.get('address')!r}")

    monkeypatch.setattr(ray, "init", connect)
    with pytest.raises(ConfigError) as run_refused:
        worker_group.ensure_ray(f"127.0.0.1:{port}")
    assert str(run_refused.value).startswith(f"cluster.ray_address: nothing answers at 127.0.0.1:{port} (Connection "
                                             "refused)")
    check_cluster_answers("auto", "RAY_ADDRESS")  # Ray's own forms are Ray's to resolve
    check_cluster_answers("ray://head:10001", "cluster.ray_address")
