"""dtensor through the training-backend conformance suite, in every layout the issue names."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from corerl.testing.conformance import TrainingBackendConformance, conformance_loss


class _DTensor(TrainingBackendConformance):
    backend_id = "dtensor"

    def _single_rank_overrides(self) -> list[str]:
        return ["policy.dtensor_cfg.tensor_parallel_size=1", "policy.dtensor_cfg.fsdp_version=2",
                "policy.dtensor_cfg.sequence_parallel=false", "policy.dtensor_cfg.dp_replicate_size=1",
                "policy.dtensor_cfg.context_parallel_size=1"]


class TestWorld1(_DTensor):
    overrides = ["cluster.gpus_per_node=1"]


class _DTensorVariant(_DTensor):
    """A layout checked for what its parallelism changes: the engine's own checks (a)-(f), (h), (k)
    and DPO's step, plus what each class below turns back on. World size 1 runs every check; the
    GRPO loss variants and top-k distillation run there and at TP2, the critic at DP2 and CP2,
    LoRA at DP2, TP2 and FSDP1, the token budgets at DP2 (packed), TP2 with SP, HSDP and CP2
    (dynamic)."""

    algorithm_checks = lora_checks = critic_checks = False
    micro_batch_layouts = ()


class TestDataParallel2(_DTensorVariant):
    lora_checks = critic_checks = True
    micro_batch_layouts = ("packed",)  # token budgets without packing: HSDP's and CP2's, two ranks as here
    overrides = ["cluster.gpus_per_node=2"]


class TestTensorParallel2(_DTensorVariant):
    algorithm_checks = lora_checks = True  # the critic: megatron's TP layout covers a tensor-parallel critic
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2"]


class TestTensorParallel2SequenceParallel(_DTensorVariant):
    # token budgets with SP's sequence-sharded activations; LoRA refuses sequence parallelism
    # (the built-in TP plan is adapted to it)
    micro_batch_layouts = ("packed", "dynamic")
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2",
                 "policy.dtensor_cfg.sequence_parallel=true"]


class TestLlamaUntiedTensorParallel2(_DTensorVariant):
    model_family = "llama"
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2"]


class TestFSDP1DataParallel2(_DTensorVariant):
    lora_checks = True  # FSDP1 wraps frozen and trained weights in one unit
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.fsdp_version=1"]


class TestActivationCheckpointingDataParallel2(_DTensorVariant):
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.activation_checkpointing=true"]


class TestHybridShardDataParallel2(_DTensorVariant):
    """HSDP: FSDP2's fully_shard over a 2-D (dp_replicate, dp_shard) mesh, replicated 2 x sharded 1
    (the critic and LoRA: DP2's, the same fully_shard call on another mesh)."""

    micro_batch_layouts = ("dynamic",)  # micro-batches accumulated before the replicas' all-reduce (packed: DP2's)
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.dp_replicate_size=2"]

    def test_each_replica_holds_the_whole_model(self, backend, model_dir, batch):
        """Replicated, not sharded: each rank's parameters and gradients are the whole model's (a
        DP2 rank of plain FSDP2 holds half)."""
        backend.load_hf(model_dir)
        backend.train_step(batch, conformance_loss)
        whole = sum(p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
        ranks = backend.state_bytes()
        assert [(rank["parameters"], rank["gradients"]) for rank in ranks] == [(whole, whole)] * 2, (whole, ranks)


class TestContextParallel2(_DTensorVariant):
    """Each sequence split over 2 ranks (ring attention), the model sharded over both by FSDP2 (the
    loss sees the gathered logprobs, and top-k distillation the gathered top-k and candidates: the
    algorithm checks run here too; LoRA wraps the projections, not attention: DP2's check)."""

    critic_checks = algorithm_checks = True
    micro_batch_layouts = ("dynamic",)  # packed rows are refused with context parallelism
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.context_parallel_size=2"]

    def test_both_ranks_split_the_same_sequences_with_ring_attention(self, backend, model_dir, batch):
        """One data-parallel rank of two ring ranks (both handed the same micro-batches), whose
        model attends with ring attention: what makes (a)-(g) above context-parallel checks."""
        backend.load_hf(model_dir)
        layouts = backend.group.call("parallel_layout")
        assert [(r["dp"], r["cp"], r["ring_rank"], r["attention"]) for r in layouts] == \
            [(1, 2, 0, "corerl_ring"), (1, 2, 1, "corerl_ring")]
        assert backend.layout.data_parallel_rank == (0, 0)


class TestTensorParallel2ContextParallel2(_DTensorVariant):
    """World size 4: a (cp 2, tp 2) layout, each ring of 2 ranks holding one tensor-parallel shard
    (the heads split over tp, the sequence over cp); the rest: the 2-rank CP class's and TP2's."""

    overrides = ["cluster.gpus_per_node=4", "policy.dtensor_cfg.context_parallel_size=2",
                 "policy.dtensor_cfg.tensor_parallel_size=2"]

    def test_both_rings_split_the_same_sequences_each_on_its_shard(self, backend, model_dir):
        backend.load_hf(model_dir)
        layouts = backend.group.call("parallel_layout")
        assert [(r["dp"], r["tp"], r["cp"], r["ring_rank"]) for r in layouts] == \
            [(1, 2, 2, 0), (1, 2, 2, 0), (1, 2, 2, 1), (1, 2, 2, 1)]
        assert backend.layout.data_parallel_rank == (0, 0, 0, 0)


@pytest.mark.gpu
@pytest.mark.xdist_group("dtensor-conformance-gpu")  # its backend is built once, in one worker (-n with --dist loadgroup)
class TestWorld1OnGpu(_DTensor):
    """The gpu tier: world size 1 on the machine's GPU (check (h) asserts the rank computes there)."""

    overrides = ["cluster.gpus_per_node=1"]
