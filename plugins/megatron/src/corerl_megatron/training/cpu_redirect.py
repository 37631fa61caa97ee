"""megatron-core on a machine without a GPU: its handful of CUDA-only calls, redirected.

megatron-core 0.16 assumes CUDA in a few places even when its models are built with
``use_cpu_initialization``: ``torch.cuda.current_device()`` as a device, ``torch.cuda.
synchronize()``, the CUDA RNG tracker, and ``device="cuda"`` literals in the pipeline
schedules; and, for mixture-of-experts layers, Transformer Engine's router GEMM name, the
all-to-all dispatcher's side CUDA stream, and split sizes that gloo takes only as Python
lists (:func:`_install_moe`). :func:`install` gives the megatron-core modules (and only them) a stand-in for
their ``torch`` global that maps those to the CPU; ``torch`` itself is not touched. It does
nothing when a GPU is present, so GPU runs use megatron-core unmodified.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

import torch

_FACTORIES = {"empty", "zeros", "ones", "full", "tensor", "arange", "randn", "rand", "empty_like", "zeros_like"}
_MODULE_PREFIX = "megatron.core"


def _cpu_device(device: Any) -> Any:
    if device is None:
        return None
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return "cpu"
    return device


class _NoOp:
    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> _NoOp:
        return self


class _CpuStream:
    """A CUDA stream and event stand-in: on the CPU work is ordered already, so waits are no-ops."""

    def wait_stream(self, *args: Any) -> None:
        return None

    def record_event(self) -> _CpuStream:
        return self

    def synchronize(self) -> None:
        return None

    def __enter__(self) -> _CpuStream:
        return self

    def __exit__(self, *args: Any) -> bool:
        return False


_STREAM = _CpuStream()


class _CpuCuda:
    """What megatron-core's modules see as ``torch.cuda`` without a GPU."""

    nvtx = _NoOp()

    @staticmethod
    def current_stream(*args: Any, **kwargs: Any) -> _CpuStream:
        return _STREAM

    @staticmethod
    def stream(stream: Any) -> _CpuStream:
        return _STREAM

    @staticmethod
    def Stream(*args: Any, **kwargs: Any) -> _CpuStream:  # noqa: N802 (torch's name)
        return _STREAM

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        """The CUDA generator's seed: there is no CUDA generator; the CPU one is seeded by the backend."""

    @staticmethod
    def get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def memory_allocated(*args: Any, **kwargs: Any) -> int:
        return 0


class _CpuTorch(types.ModuleType):
    """What megatron-core's modules see as ``torch``: torch, with ``cuda`` and CUDA devices mapped to the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        if name in _FACTORIES:
            def factory(*args: Any, **kwargs: Any) -> Any:
                if "device" in kwargs:
                    kwargs["device"] = _cpu_device(kwargs["device"])
                kwargs.pop("pin_memory", None)
                return value(*args, **kwargs)

            return factory
        return value


_STAND_IN = _CpuTorch()


def _cpu_rng_fork(self: Any, name: str = "model-parallel-rng") -> Any:
    """The RNG tracker's fork without a CUDA generator: dropout draws from the CPU generator."""
    return contextlib.nullcontext()


def _clip_by_total_norm(parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False) -> None:
    """megatron-core's clip, without its check that gradients are CUDA tensors."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    coeff = max_norm / (total_norm + 1.0e-6)
    if coeff < 1.0:
        for p in params:
            grad = p.decoupled_grad if use_decoupled_grad else p.grad
            if grad is not None:
                grad.mul_(coeff)


@contextlib.contextmanager
def _tensor_cuda_is_identity() -> Any:
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[method-assign]


def _cpu_setup_embeddings(original: Any) -> Any:
    """The tied-embedding set-up of a pipelined model calls ``weight.data.cuda()``: on the CPU
    that copy stays where it is (only while the set-up runs)."""

    def setup(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _tensor_cuda_is_identity():
            return original(self, *args, **kwargs)

    setup.__wrapped__ = original  # type: ignore[attr-defined]
    return setup


def _split_sizes_as_lists(original: Any) -> Any:
    """The dispatcher's ``maybe_move_tensor_to_cpu``: on the CPU its ``as_numpy`` split sizes
    stay tensors, which gloo's ``all_to_all_single`` refuses; give them as numpy arrays."""

    def move(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if as_numpy and isinstance(tensor, torch.Tensor):
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    move.__wrapped__ = original  # type: ignore[attr-defined]
    return move


def _install_moe() -> None:
    """megatron-core's MoE layers without a GPU: 0.16.1 names ``te_general_gemm`` in the router
    without defining it when Transformer Engine is absent, the all-to-all dispatcher copies on a
    side CUDA stream, and its split sizes must reach gloo as lists."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]
    token_dispatcher.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _STREAM  # type: ignore[assignment]
    if not hasattr(token_dispatcher.maybe_move_tensor_to_cpu, "__wrapped__"):
        token_dispatcher.maybe_move_tensor_to_cpu = _split_sizes_as_lists(token_dispatcher.maybe_move_tensor_to_cpu)


def install() -> bool:
    """Redirect the loaded megatron-core modules when there is no GPU; True when it did.
    Call it after importing the megatron-core modules a backend uses (it is idempotent)."""
    if torch.cuda.is_available():
        return False
    from megatron.core.tensor_parallel import random as mp_random

    mp_random.CudaRNGStatesTracker.fork = _cpu_rng_fork  # type: ignore[method-assign]
    from megatron.core.optimizer import clip_grads, optimizer

    clip_grads.clip_grad_by_total_norm_fp32 = _clip_by_total_norm
    optimizer.clip_grad_by_total_norm_fp32 = _clip_by_total_norm
    from megatron.core.models.common.language_module.language_module import LanguageModule

    if not hasattr(LanguageModule.setup_embeddings_and_output_layer, "__wrapped__"):
        LanguageModule.setup_embeddings_and_output_layer = _cpu_setup_embeddings(  # type: ignore[method-assign]
            LanguageModule.setup_embeddings_and_output_layer)
    _install_moe()
    for name, module in list(sys.modules.items()):
        if name.startswith(_MODULE_PREFIX) and getattr(module, "torch", None) is torch:
            module.torch = _STAND_IN  # type: ignore[attr-defined]
    return True
