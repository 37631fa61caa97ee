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


class TestDataParallel2(_DTensor):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: at world size 1 and TP2
    micro_batch_layouts = ("packed",)  # token budgets without packing: HSDP's and CP2's, two ranks as here
    overrides = ["cluster.gpus_per_node=2"]


class TestTensorParallel2(_DTensor):
    micro_batch_layouts = ()  # token budgets: at world size 1, DP2 and TP2 with SP (which covers TP2's)
    critic_checks = False  # the critic runs in the world-1 and data-parallel layouts (megatron's covers TP)
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2"]


class TestTensorParallel2SequenceParallel(_DTensor):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: at world size 1 and TP2
    lora_checks = False  # LoRA refuses sequence parallelism (the built-in TP plan is adapted to it)
    critic_checks = False  # the critic runs in the world-1 and data-parallel layouts
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2",
                 "policy.dtensor_cfg.sequence_parallel=true"]


class TestLlamaUntiedTensorParallel2(_DTensor):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: at world size 1 and TP2
    lora_checks = False  # LoRA runs in the world-1, data-parallel, tensor-parallel and FSDP1 layouts
    micro_batch_layouts = ()  # token budgets: checked at world size 1, DP2 and TP2 with SP
    critic_checks = False  # the critic runs in the world-1 and data-parallel layouts
    model_family = "llama"
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2"]


class TestFSDP1DataParallel2(_DTensor):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: at world size 1 and TP2
    micro_batch_layouts = ()  # token budgets: checked at world size 1, DP2 and TP2 with SP
    critic_checks = False  # the critic runs in the world-1 and data-parallel layouts
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.fsdp_version=1"]


class TestActivationCheckpointingDataParallel2(_DTensor):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: at world size 1 and TP2
    lora_checks = False  # LoRA runs in the world-1, data-parallel, tensor-parallel and FSDP1 layouts
    micro_batch_layouts = ()  # token budgets: checked at world size 1, DP2 and TP2 with SP
    critic_checks = False  # the critic runs in the world-1 and data-parallel layouts
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.activation_checkpointing=true"]


class TestHybridShardDataParallel2(_DTensor):
    """HSDP: FSDP2's fully_shard over a 2-D (dp_replicate, dp_shard) mesh, replicated 2 x sharded 1."""

    algorithm_checks = False  # the GRPO loss variants and top-k distillation: at world size 1 and TP2
    critic_checks = lora_checks = False  # the critic and LoRA: DP2's (the same fully_shard call, another mesh)
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


class TestContextParallel2(_DTensor):
    """Each sequence split over 2 ranks (ring attention), the model sharded over both by FSDP2."""

    algorithm_checks = False  # what the loss sees is the gathered logprobs: the GRPO variants are DP2's
    lora_checks = False  # LoRA wraps the projections, not attention: DP2's check
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


class TestTensorParallel2ContextParallel2(_DTensor):
    """World size 4: a (cp 2, tp 2) layout, each ring of 2 ranks holding one tensor-parallel shard
    (the heads split over tp, the sequence over cp)."""

    algorithm_checks = critic_checks = lora_checks = False  # the 2-rank CP class and TP2's
    micro_batch_layouts = ()  # token budgets: the 2-rank CP class's
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
