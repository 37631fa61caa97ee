"""The training-backend conformance suite: subclass :class:`TrainingBackendConformance`.

Any training backend runs the same checks, on a tiny model built in code::

    from corerl.testing.conformance import TrainingBackendConformance

    class TestMyBackendWorld1(TrainingBackendConformance):
        backend_id = "mine"
        overrides = ["policy.mine_cfg.enabled=true", "cluster.gpus_per_node=1"]

One subclass per layout (world size, parallel sizes). The checks:

(a) logprobs equal a plain transformers forward within ``tolerance`` (fp32);
(b) one train step on a fixed batch gives the loss and the updated weights of a plain
    single-process PyTorch step (whole batch at once, SGD, gradient clipping);
(c) at world size > 1, logprobs, losses and weights equal the same backend at world size 1;
(d) save, load into a fresh model, continue equals uninterrupted training (with SGD's momentum,
    and in world-size-1 layouts with Adam(W)'s moments: ``adam_overrides``); in world-size-1
    layouts ``policy.precision=bfloat16`` gives logprobs within ``bf16_tolerance`` of the fp32
    reference and further from it than 10 x ``tolerance`` (a backend that ignores the precision
    fails; contract 2.15);
(e) the exported Hugging Face checkpoint loads with transformers, reproduces the logprobs,
    and carries the tokenizer;
(f) the weight stream covers every parameter with Hugging Face names and shapes;
(g) with sequence packing (the default packer) and with dynamic token-budget micro-batches,
    logprobs, the loss, the gradient norm and the (clipped) gradients equal a plain forward
    of each sequence alone, unpadded (set ``micro_batch_layouts`` to narrow this);
(h) for backends that report ``worker_devices()``: one device per rank, of a kind the machine
    has; on a GPU machine (``gpu`` mark, skipped without one) every rank computes on CUDA;
(i) DPO's pair loss (:class:`corerl.algorithms.dpo_math.DPOLoss`, whose pairs must not be split)
    gives the loss and the weights of a plain step on the whole batch, in this layout (one pair
    per micro-batch) and, in (g)'s token-budget layouts, with pairs packed or grouped by tokens;
    so do GRPO's loss variants (:data:`GRPO_LOSS_VARIANTS`: CISPO, and Dr. GRPO's constant
    normaliser, both with asymmetric ratio bounds) on a batch whose ratios are partly clipped;
(j) as PPO's critic (``role="critic"``, for a registration with ``value_model=True``; others are
    checked to be refused for PPO): values equal a plain transformers token-classification
    forward, one clipped-value-loss step gives the loss and weights of a plain PyTorch step, save,
    load and continue equals uninterrupted training, and the exported checkpoint loads as a value
    model that reproduces the values. With (g)'s packed sequences the values and the step equal
    each sequence run alone, unpadded;
(k) enabling the backend's section (without ``policy.training_backend``) selects it; the loss
    function's metrics come back summed over micro-batches and ranks; offload then reload leaves
    the engine computing the same logprobs and training on, and ``state_bytes()`` (where there is
    one) reports every rank; from contract 2.15 the offload moves the state: while offloaded the
    ranks hold 0 bytes of it on their device (on a GPU, the memory is freed), and the reload brings
    back the same bytes (:func:`corerl.testing.offload_check.check_offload_keeps_state`);
(l) with ``policy.lora`` (a registration with ``lora=True``): two LoRA steps give the losses and the
    adapter of two plain PEFT steps in PyTorch from the same starting adapter, the base model
    (the adapter switched off) still computes the starting logprobs (only adapter parameters
    moved), and the refit's adapter and the exported PEFT folder hold adapter tensors only; a
    registration without it is refused with ``policy.lora.enabled``, in one line.

A layout's class attributes say which checks it leaves to the backend's other layouts
(``algorithm_checks``, ``critic_checks``, ``lora_checks``, ``micro_batch_layouts``,
``adam_overrides``, ``bf16_tolerance``) or cannot run (the world-size-1 comparison (c) at world size
1, a critic for a registration without ``value_model``...): those are deselected, not skipped
(:class:`ConformanceLayout`, through corerl's pytest plugin); a skip means the machine cannot run
the check (no GPU, an engine refusing here) and says why.

Mixture-of-experts checks (m1-m5) are a class of their own, :class:`MoeConformance`: one more
subclass per backend (one engine for it), expert parallelism 2 at world size 2 where the
registration names its key; a backend registered without ``moe=True`` is checked to be refused.

A backend is held to the contract version its plugin states (``corerl_contract``; none stated:
the oldest this corerl loads). A check that needs what a later version added (a loss metric, the
routers' metrics, ``topk_logprobs``) is skipped for an older plugin and fails for one that states
that version, both in one line naming the metric or method, the version and how to add it
(:mod:`corerl.testing.contract_versions`).

The suite is a package, one module per concern; every name is importable from here too:
:mod:`~corerl.testing.conformance.inputs` (the recipe's optimizer settings, the batches and losses),
:mod:`~corerl.testing.conformance.layout` (the layouts' bases), :mod:`~corerl.testing.conformance.training`
(:class:`TrainingBackendConformance` and the policy's checks), :mod:`~corerl.testing.conformance.critic`
((j)), :mod:`~corerl.testing.conformance.lora` ((l)) and :mod:`~corerl.testing.conformance.moe`
(:class:`MoeConformance`). Where two checks compare tensors they use
:func:`corerl.testing.reference.max_diff`; the offload of (k) is
:func:`corerl.testing.offload_check.offload_round_trip`.
"""

from __future__ import annotations

from corerl.testing.conformance.critic import (
    _CRITIC_ENGINE_CHECKS,  # noqa: F401
    CriticChecks,
)
from corerl.testing.conformance.inputs import (
    GRPO_LOSS_VARIANTS,
    LR,
    MAX_GRAD_NORM,
    MOMENTUM,
    conformance_batch,
    conformance_loss,
    dpo_conformance_loss,
    grpo_conformance_batch,
    grpo_conformance_loss,
    preference_conformance_batch,
    save_load_continue,
    value_conformance_batch,
    value_conformance_loss,
    write_conformance_critic,
)
from corerl.testing.conformance.inputs import save_load_continue as _save_load_continue  # noqa: F401
from corerl.testing.conformance.layout import (
    _REGISTRATIONS,  # noqa: F401
    BackendLayout,
    ConformanceLayout,
    TrainingLayout,
)
from corerl.testing.conformance.lora import LoraChecks
from corerl.testing.conformance.moe import (
    _MOE_ENGINE_CHECKS,  # noqa: F401
    MoeConformance,
)
from corerl.testing.conformance.training import (
    _ALGORITHM_VARIANT_CHECKS,  # noqa: F401
    BF16_COMPUTE,
    BF16_MIN_FACTOR,
    TrainingBackendConformance,
    TrainingChecks,
)

# what the module imported for its checks before it was a package, still importable from here (as
# its private names are, above)
from corerl.testing.contract_versions import (
    CANDIDATE_LOGPROBS,
    LOSS_METRICS,
    OFFLOAD_MOVES_STATE,
    ROUTER_METRICS,
    TOPK_LOGPROBS,
    ContractCheck,
    Requirement,
    stated_contract,
)
from corerl.testing.offload_check import check_offload_keeps_state
from corerl.testing.reference import (
    hf_logprobs,
    hf_topk,
    reference_gradients,
    reference_lora_steps,
    reference_sgd_step,
)
from corerl.testing.reference import max_diff as _max_diff  # noqa: F401

__all__ = [
    # the classes a backend's tests subclass, and the mixins and bases they are made of
    "TrainingBackendConformance", "MoeConformance", "ConformanceLayout", "BackendLayout", "TrainingLayout",
    "TrainingChecks", "CriticChecks", "LoraChecks",
    # the recipe's optimizer settings and the checks' inputs
    "LR", "MOMENTUM", "MAX_GRAD_NORM", "BF16_MIN_FACTOR", "BF16_COMPUTE", "GRPO_LOSS_VARIANTS",
    "conformance_batch", "conformance_loss", "preference_conformance_batch", "dpo_conformance_loss",
    "grpo_conformance_batch", "grpo_conformance_loss", "value_conformance_batch", "value_conformance_loss",
    "write_conformance_critic", "save_load_continue",
    # what the module imported for its checks before it was a package (a star import keeps them)
    "CANDIDATE_LOGPROBS", "LOSS_METRICS", "OFFLOAD_MOVES_STATE", "ROUTER_METRICS", "TOPK_LOGPROBS", "ContractCheck",
    "Requirement", "stated_contract", "check_offload_keeps_state", "hf_logprobs", "hf_topk", "reference_gradients",
    "reference_lora_steps", "reference_sgd_step",
]
