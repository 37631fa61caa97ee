"""The rank-side template of a training backend: what every rank worker does alike.

A training backend's driver half (:mod:`corerl.training.contract`) runs one worker per rank,
a Ray actor or, for world size 1, an object in the driver. The worker's rank-side protocol is:

- ``load_hf(model_path)``: build the model shard and its optimizer from a Hugging Face folder;
- ``logprobs(mbs) -> list[Tensor] | None``: per-token logprobs of this rank's micro-batches;
- ``values(mbs) -> list[Tensor] | None``: the same for values, on a critic (``config.role``
  is ``"critic"``: the model is a value model, :mod:`corerl.models.value_model`);
- ``topk_logprobs(mbs, k) -> list[Tensor] | None``: the logprobs and the top-k next tokens
  (a distillation teacher's; :func:`corerl.training.logprobs.join_topk`);
- ``train_step(mbs, loss_fn, normaliser) -> dict``: one optimizer step (the loss function gets
  logprobs, or values on a critic); the dict holds ``loss``,
  ``grad_norm``, ``lr``, ``step`` and ``metrics`` (sums over the micro-batches; ``None`` on a
  rank that does not report, e.g. an early pipeline stage);
- ``save_checkpoint(path)`` / ``load_checkpoint(path)``: every rank, then a barrier;
- ``full_state_dict() -> dict | None``: every rank calls it; the reporting rank gets the full
  weights (Hugging Face names, on CPU); ``export_hf(path)`` writes them there (``full_hf_state``:
  the same, with a LoRA adapter merged in);
- with ``policy.lora`` (:mod:`corerl.lora`): ``base_logprobs(mbs)`` with the adapter switched off,
  ``adapter_state() -> dict | None`` (the adapter on the reporting rank, PEFT's names) and
  ``export_adapter(path)`` (a PEFT adapter folder);
- ``offload(parts)`` / ``reload(parts)`` with parts from ``parameters``/``optimizer``: the parts'
  state leaves the rank's device between phases and comes back unchanged. On a GPU the backend's
  :meth:`RankWorker.move` moves it; on a CPU (and where a backend's ``move`` keeps the default) the
  storages of :meth:`RankWorker.phase_tensors` are parked in host memory and freed
  (:mod:`corerl.training.parking`), and the rank refuses to compute from a parked part;
- ``state_bytes() -> dict``: ``parameters``, ``gradients``, ``optimizer`` bytes this rank holds on
  its device now (0 for a part offloaded, the same again after its reload);
- ``pid()``, ``shutdown()``, and the device report of :class:`RankDeviceReport`.

A mixture-of-experts model gets router hooks when loaded (:mod:`corerl.training.moe_router`,
``policy.moe``): the router frozen before the optimizer is built, the load-balancing and z-loss
terms added to each micro-batch's backpropagated loss (the loss function's own loss, reported as
``loss``, untouched), ``moe/*`` metrics in each step's, and with ``router_replay: r2`` the
routing recorded by ``logprobs`` replayed by ``train_step``.

:class:`RankWorker` implements all of it around a few methods a backend supplies: how it sets
up its process groups, builds the model, runs a forward pass, a backward pass and an
optimizer step, and saves its own state. A backend with its own schedule (megatron's
pipeline) overrides ``logprobs``/``train_step`` and keeps the rest.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

from corerl.distributed.devices import RankDeviceReport, rank_device
from corerl.distributed.rank_state import barrier, capture_rng, restore_rng
from corerl.training.recipe_config import RecipeConfig
from corerl.training.step_totals import StepTotals

if TYPE_CHECKING:  # the worker modules that subclass RankWorker import torch; this one waits until it runs
    import torch

log = logging.getLogger(__name__)


class RankWorker(RankDeviceReport):
    """One rank of a training backend. Subclasses set :attr:`settings_key` and supply
    :meth:`load_hf`, :meth:`forward_logprobs`, :meth:`optimizer_step`, :meth:`full_state_dict`
    and :meth:`state_bytes` (and :meth:`forward_values` to train critics), and
    :meth:`phase_tensors` for offload between phases; the rest has defaults that most backends
    keep. :attr:`critic` says which model the rank holds."""

    settings_key: ClassVar[str]  # the recipe section of the backend, e.g. "policy.dtensor_cfg"
    quiet_warnings: ClassVar[tuple[str, ...]] = ()  # library notices that say nothing about a run

    def __init__(self, *, rank: int, world_size: int, config: RecipeConfig, threads: int | None = None,
                 **options: Any) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        for pattern in self.quiet_warnings:
            warnings.filterwarnings("ignore", message=pattern)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.rank, self.world_size, self.config = rank, world_size, config
        self.critic = config.role == "critic"  # a value model: values, not logprobs
        self.settings = config.section(self.settings_key)
        self.device = rank_device()  # the GPU of this rank's Ray bundle (the one it sees), else the CPU
        self.step = 0
        self.grad_bytes = 0
        self.model_path: str | None = None
        self.hf_config: Any = None
        from corerl.lora.adapter import lora_enabled

        self.lora = lora_enabled(config)  # the model is wrapped by PEFT: only its adapter trains
        self.peft_model: Any = None  # that PEFT model (inside any wrappers the backend adds)
        self.router: Any = None  # a MoE model's router hooks (corerl.training.moe_router), set by load_pretrained
        from corerl.training.parking import HostStore

        self.parked = HostStore()  # the parts offloaded by parking (phase_tensors' storages) and their host copies
        self.setup(**options)

    # -- what a backend supplies ---------------------------------------------------------

    def setup(self, **options: Any) -> None:
        """Process groups, meshes: what the rank needs before a model is loaded."""

    def load_hf(self, model_path: str) -> None:
        """Build the model shard and its optimizer from a Hugging Face folder (set
        ``model_path``, ``hf_config`` and reset ``step``)."""
        raise NotImplementedError

    def set_mode(self, training: bool) -> None:
        """Train or eval mode of the model."""
        raise NotImplementedError

    def forward_logprobs(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token logprobs of one micro-batch already on :attr:`device` (graph kept in training)."""
        raise NotImplementedError

    def forward_values(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token values of one micro-batch on a critic (see
        :func:`corerl.models.value_model.model_values`), graph kept in training."""
        raise NotImplementedError(f"{type(self).__name__} does not compute values (it cannot train a critic)")

    def forward(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """What the loss reads: values on a critic, logprobs otherwise."""
        return self.forward_values(mb) if self.critic else self.forward_logprobs(mb)

    def load_pretrained(self, model_path: str, **options: Any) -> Any:
        """The Hugging Face model at ``model_path`` for this rank's role: a causal LM, or a critic's
        value model (:mod:`corerl.models.value_model`), in float32 on the CPU; with ``policy.lora``,
        wrapped by PEFT with a fresh adapter (:func:`corerl.lora.adapter.apply_lora`). A
        mixture-of-experts model gets its router hooks (:attr:`router`, ``policy.moe``: the router
        frozen here, before the backend builds its optimizer), and a vision-language model's vision
        tower where ``policy.freeze_vision_tower`` says so."""
        from corerl.models.value_model import load_pretrained
        from corerl.training.moe_router import attach_router

        model = load_pretrained(model_path, self.config.role, **options)
        if not self.critic:  # a vision-language policy: its vision tower out of the optimizer unless trained
            from corerl.models.vision import freeze_vision_tower

            freeze_vision_tower(model, self.config)
        if self.lora:
            from corerl.lora.adapter import apply_lora

            model = self.peft_model = apply_lora(model, self.config.core.policy.lora, model_path,
                                                   freeze_router=self.config.core.policy.moe.freeze_router)
        if self.router is not None:  # a reload: the old model's hooks go with it
            self.router.remove()
        self.router = attach_router(model, self.config, replay=not self.critic)
        return model

    def before_micro_batch(self, index: int, last: bool) -> None:
        """Before micro-batch ``index`` of a step: e.g. gradient sync only on the last."""

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate one micro-batch's loss. The loss is this rank's share of a sum over the
        data-parallel ranks, and data-parallel wrappers average gradients: scale by their count."""
        (loss * self.data_parallel_size()).backward()

    def data_parallel_size(self) -> int:
        return self.world_size

    def optimizer_step(self) -> tuple[float, float]:
        """Clip, step the optimizer and scheduler, zero the gradients; returns (grad norm, the lr
        the step used). Record :attr:`grad_bytes` before the optimizer frees gradients."""
        raise NotImplementedError

    def save_state(self, path: str) -> dict[str, Any]:
        """Write the model and optimizer state under ``path`` (collectively, on every rank);
        returns small per-rank state (a scheduler's) for the rank's sidecar file."""
        raise NotImplementedError

    def load_state(self, path: str, sidecar: dict[str, Any]) -> None:
        """Read back what :meth:`save_state` wrote (``sidecar``: what it returned)."""
        raise NotImplementedError

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        raise NotImplementedError

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds on its device for ``parameters``, ``gradients`` and ``optimizer``
        state: 0 for a part offloaded (:meth:`resident_bytes` counts what is there)."""
        raise NotImplementedError

    def phase_tensors(self, part: str) -> list[torch.Tensor] | None:
        """The tensors that hold ``part`` (``parameters``: this rank's shards of the model's
        parameters; ``optimizer``: its optimizer's state, master copies included) for offload
        between phases to park; None where the backend cannot say (offload is then a logged
        no-op on a CPU)."""
        return None

    def move(self, device: torch.device, parts: list[str]) -> None:
        """Move ``parts`` (``parameters``, ``optimizer``) to ``device``; only called on a GPU. This
        default parks the storages of :meth:`phase_tensors` in host memory (the CPU's way)."""
        if device.type == "cpu":
            self._park(parts)
        else:
            self._unpark(parts)

    def release(self) -> None:
        """Free what the backend holds beyond the process group (an engine) at shutdown."""

    # -- the template --------------------------------------------------------------------

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        import torch

        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def logprobs(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        """Logprobs of each of this rank's micro-batches (planned by the driver): the old
        policy's, whose routing ``policy.moe.router_replay: r2`` records for the training forward."""
        return self._logprobs(mbs, record=True)

    def _logprobs(self, mbs: list[dict[str, torch.Tensor]], record: bool) -> list[torch.Tensor]:
        import torch

        if self.critic:
            raise RuntimeError("a critic computes values, not logprobs")
        self.require_resident("parameters")
        self.set_mode(False)
        router = self.router if record else None
        if router is None:
            with torch.no_grad():
                return [self.forward_logprobs(self.to_device(mb)).float().cpu() for mb in mbs]
        router.start_recording()
        out = []
        with torch.no_grad():
            for mb in mbs:
                mb = self.to_device(mb)
                with router.micro_batch(mb, training=False) as current:
                    out.append(self.forward_logprobs(mb).float().cpu())
                router.record(mb, current)
        router.share_recording(self.world_size)
        return out

    def topk_logprobs(self, mbs: list[dict[str, torch.Tensor]], k: int) -> list[torch.Tensor] | None:
        """Per micro-batch, the token logprobs and the ``k`` most likely next tokens from one
        forward pass, as :func:`corerl.training.logprobs.join_topk` lays them out: a frozen
        teacher's side of a top-k distillation loss."""
        import torch

        from corerl.training.logprobs import TOPK_REQUEST, join_topk

        if self.critic:
            raise RuntimeError("a critic computes values, not logprobs")
        self.require_resident("parameters")
        self.set_mode(False)
        out = []
        with torch.no_grad():
            for mb in mbs:
                mb = self.to_device({**mb, TOPK_REQUEST: torch.tensor(k)})
                out.append(join_topk(self.forward_logprobs(mb), mb).cpu())
        return out

    def values(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        """Values of each of this rank's micro-batches, on a critic."""
        import torch

        self.require_resident("parameters")
        self.set_mode(False)
        with torch.no_grad():
            return [self.forward_values(self.to_device(mb)).float().cpu() for mb in mbs]

    def base_logprobs(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        """Logprobs of the base model, the LoRA adapter switched off
        (:func:`corerl.lora.adapter.adapter_off`): the KL reference of a LoRA policy, with no
        second copy of the weights."""
        from corerl.lora.adapter import adapter_off

        if self.peft_model is None:
            raise RuntimeError("base_logprobs() needs a LoRA policy (policy.lora.enabled)")
        with adapter_off(self.peft_model):
            return self._logprobs(mbs, record=False)  # the reference's routing is not the old policy's

    def train_step(self, mbs: list[dict[str, torch.Tensor]], loss_fn: Any, normaliser: float) -> dict[str, Any]:
        """One optimizer step over this rank's micro-batches, gradients accumulated."""
        self.require_resident("parameters", "optimizer")
        self.set_mode(True)
        totals = StepTotals()
        for index, mb in enumerate(mbs):
            self.before_micro_batch(index, index == len(mbs) - 1)
            mb = self.to_device(mb)
            if self.router is None:
                loss, metrics = loss_fn(self.forward(mb), mb, normaliser)
                self.backward(loss)
            else:  # a MoE model: the router's loss terms join the backpropagated loss, its metrics the step's
                with self.router.micro_batch(mb, training=True) as current:
                    loss, metrics = loss_fn(self.forward(mb), mb, normaliser)
                term, router_metrics = self.router.step_terms(mb, current, normaliser)
                self.backward(loss if term is None else loss + term)
                metrics = {**metrics, **router_metrics}
            totals.add(loss, metrics)
        total, metrics = totals.result()
        grad_norm, lr = self.optimizer_step()
        self.step += 1
        return {"loss": total, "grad_norm": grad_norm, "lr": lr, "step": self.step, "metrics": metrics}

    def _sidecar(self, path: str) -> str:
        return os.path.join(path, f"rank{self.rank}.pt")

    def save_checkpoint(self, path: str) -> None:
        """The backend's state, then this rank's sidecar (step, RNG state, the backend's extras)."""
        import torch

        from corerl.failures import checkpoint_errors

        self.require_resident("parameters", "optimizer")
        with checkpoint_errors("saving", path):
            extra = self.save_state(path)
        torch.save({"step": self.step, "rng": capture_rng(), **extra}, self._sidecar(path))
        barrier()

    def load_checkpoint(self, path: str) -> None:
        from corerl.checkpoint_safety import load_plain
        from corerl.failures import checkpoint_errors

        sidecar = load_plain(self._sidecar(path))
        with checkpoint_errors("loading", path):
            self.load_state(path, sidecar)
        self.step = sidecar["step"]
        restore_rng(sidecar["rng"])
        barrier()

    def full_hf_state(self) -> dict[str, torch.Tensor] | None:
        """:meth:`full_state_dict`, with a LoRA adapter merged into the base weights by PEFT
        (every rank calls it; the reporting rank gets the weights)."""
        self.require_resident("parameters")
        state = self.full_state_dict()
        if not self.lora or state is None:
            return state
        from corerl.lora.adapter import adapter_tensors, base_hf_state, config_dict, merged_hf_state

        return merged_hf_state(base_hf_state(state), adapter_tensors(state.items()), self.hf_config,
                               config_dict(self.config.core.policy.lora, self.model_path))

    def export_hf(self, path: str) -> None:
        from corerl.training.hf_export import export_on_rank_zero

        export_on_rank_zero(self.rank, self.full_hf_state(), self.hf_config, self.model_path, path,
                            role=self.config.role)

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        """The LoRA adapter's tensors on rank 0 (PEFT's saved names, on the CPU); None elsewhere.
        Every rank calls it. This default gathers each adapter parameter whole (``full_tensor``
        where it is a DTensor); a backend whose parameters are shards of another kind overrides it."""
        from corerl.lora.adapter import adapter_tensors, is_adapter_name

        self.require_resident("parameters")
        pairs = []
        for name, param in self.peft_model.named_parameters():
            if is_adapter_name(name):
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
                pairs.append((name, full))
        return adapter_tensors(pairs) if self.rank == 0 else None

    def export_adapter(self, path: str) -> None:
        """Rank 0 writes the PEFT adapter folder (and the tokenizer) at ``path``; the others wait."""
        from corerl.lora.adapter import config_dict, write_adapter
        from corerl.training.hf_export import copy_tokenizer

        state = self.adapter_state()
        if self.rank == 0:
            assert state is not None and self.model_path is not None
            write_adapter(path, state, config_dict(self.config.core.policy.lora, self.model_path))
            copy_tokenizer(self.model_path, path)
        barrier()

    def offload(self, parts: list[str]) -> None:
        """``parts`` leave this rank's device until :meth:`reload`: moved to the CPU by
        :meth:`move` on a GPU, parked in host memory on a CPU."""
        import torch

        if self.device.type == "cpu":
            self._park(parts)
        else:
            self.move(torch.device("cpu"), parts)

    def reload(self, parts: list[str]) -> None:
        """``parts`` back on this rank's device, as they were before :meth:`offload`."""
        if self.device.type == "cpu":
            self._unpark(parts)
        else:
            self.move(self.device, parts)

    def _park(self, parts: list[str]) -> None:
        for part in parts:
            tensors = self.phase_tensors(part)
            if tensors is None:
                log.info("%s rank %d: offloading %s between phases is not supported (the backend does not say "
                         "which tensors hold it): it stays", type(self).__name__, self.rank, part)
                continue
            moved = self.parked.park(part, tensors)
            log.debug("%s rank %d: parked %s (%d bytes)", type(self).__name__, self.rank, part, moved)
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _unpark(self, parts: list[str]) -> None:
        for part in parts:
            moved = self.parked.unpark(part)
            log.debug("%s rank %d: reloaded %s (%d bytes)", type(self).__name__, self.rank, part, moved)

    def require_resident(self, *parts: str) -> None:
        """Refuse to compute while one of ``parts`` is parked (its storages hold nothing)."""
        away = [part for part in parts if part in self.parked]
        if away:
            raise RuntimeError(f"{type(self).__name__} rank {self.rank}: {' and '.join(away)} offloaded; "
                               "reload() before computing")

    def resident_bytes(self, tensors: Any) -> int:
        """Bytes of the distinct storages behind ``tensors`` (None entries skipped) that are on this
        rank's device: a parked storage is empty, a tensor moved to the CPU from a GPU is elsewhere."""
        from corerl.training.memory import local_tensor, storage_bytes

        return storage_bytes(t for t in tensors if t is not None and local_tensor(t).device.type == self.device.type)

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        import torch.distributed as dist

        self.release()
        if dist.is_initialized():
            dist.destroy_process_group()

