"""Methods vLLM mixes into its workers (``LLM(worker_extension_cls=...)``) for in-place refit."""

from __future__ import annotations


class RefitExtension:
    """Loads new weights into the running model without restarting the engine."""

    def corerl_reload_weights(self, blob: bytes) -> int:
        """``blob`` is a safetensors archive of ``{Hugging Face name: tensor}``; returns how many tensors."""
        from safetensors.torch import load

        weights = load(blob)
        # reload_weights re-runs the loader's post-processing: the CPU kernels use a pre-packed copy
        # of each weight, so a plain model.load_weights() would leave the outputs unchanged.
        self.reload_weights(weights_iterator=list(weights.items()))
        return len(weights)

    def corerl_reload_shared(self, manifest: object) -> int:
        """The weights named by a :class:`corerl.generation.shared_weights.WeightManifest`, read as
        views of the shared-memory file the driver wrote (no copy before vLLM's own)."""
        from corerl.sdk import read_shared

        weights = read_shared(manifest)  # type: ignore[arg-type]
        self.reload_weights(weights_iterator=weights)
        return len(weights)
