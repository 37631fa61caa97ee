"""PEFT's LoRA on a Hugging Face model, as every training backend that holds one uses it.

corerl writes no LoRA layers of its own: ``peft.get_peft_model`` wraps the target linear layers,
PEFT's per-layer switch gives the base model back for the KL reference (:func:`adapter_off`), and
``merge_and_unload`` writes the merged model. What is ours: the mapping from ``policy.lora`` to a
``LoraConfig``, and names. An adapter tensor crosses processes under PEFT's saved name (the one
``adapter_model.safetensors`` uses, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``):
wrappers' segments (FSDP1's, the activation-checkpoint wrapper's) and the adapter's own name
(``default``) are removed.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

ADAPTER_NAME = "default"  # PEFT's name of the one adapter a model gets
ADAPTER_FILE = "adapter_model.safetensors"
_WRAPPER_SEGMENTS = re.compile(r"(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)\.")


class LoraSettings(Protocol):
    """What an adapter is built from: ``policy.lora`` (:class:`corerl.config.schema.LoraConfig`,
    which the models layer, below the config schema, names only through this protocol)."""

    @property
    def target_modules(self) -> Sequence[str]: ...
    @property
    def exclude_modules(self) -> Sequence[str]: ...
    @property
    def match_all_linear(self) -> bool: ...
    @property
    def dim(self) -> int: ...
    @property
    def alpha(self) -> float: ...
    @property
    def dropout(self) -> float: ...
    @property
    def lora_A_init(self) -> str: ...  # noqa: N802 (NeMo RL's key name)


def lora_enabled(config: Any) -> bool:
    """Whether the model this config builds gets an adapter: the policy with ``policy.lora.enabled``
    (PPO's critic, built from a config with ``role="critic"``, is trained whole)."""
    return bool(config.core.policy.lora.enabled) and getattr(config, "role", "policy") != "critic"


def peft_config(settings: LoraSettings, base_model_path: str | None = None) -> Any:
    """``policy.lora`` as PEFT's ``LoraConfig`` for a causal LM; on a vision-language model the
    adapter stays on the language model (the vision tower's modules are excluded)."""
    import re

    from peft import LoraConfig

    from corerl.models.hf_config import is_vision_language, read_hf_config

    targets: Any = "all-linear" if settings.match_all_linear or not settings.target_modules else list(settings.target_modules)
    exclude: Any = list(settings.exclude_modules) or None
    if base_model_path is not None and is_vision_language(read_hf_config(base_model_path)):
        names = "|".join(re.escape(name) for name in exclude or [])
        exclude = r"(.*\.)?visual(\..*)?" + (rf"|(.*\.)?({names})" if names else "")
    return LoraConfig(
        r=settings.dim, lora_alpha=settings.alpha, lora_dropout=settings.dropout, target_modules=targets,
        exclude_modules=exclude, task_type="CAUSAL_LM", bias="none",
        init_lora_weights=True, base_model_name_or_path=base_model_path,
    )


def apply_lora(model: Any, settings: LoraSettings, base_model_path: str | None = None, *,
               freeze_router: bool = True) -> Any:
    """``model`` wrapped by PEFT with a fresh adapter (B zero, so it computes what ``model`` did);
    every base weight frozen. ``lora_A_init: xavier`` re-initialises A with Xavier-normal (PEFT's
    own is Kaiming-uniform, ``uniform``).

    On a mixture of experts, PEFT's ``all-linear`` adapts the attention projections, the experts'
    fused ``gate_up_proj``/``down_proj`` (as ``target_parameters``, the fused one at twice the rank)
    and the router. ``freeze_router`` (``policy.moe.freeze_router``, on by default) keeps the
    router's adapter at zero and out of training (:func:`freeze_router_adapters`): routing stays
    the base model's, as with full fine-tuning under that key."""
    import torch
    from peft import get_peft_model

    wrapped = get_peft_model(model, peft_config(settings, base_model_path))
    if settings.lora_A_init == "xavier":
        with torch.no_grad():
            for name, param in wrapped.named_parameters():
                if ".lora_A." in name:
                    torch.nn.init.xavier_normal_(param)
    if freeze_router:
        freeze_router_adapters(wrapped)
    return wrapped


def freeze_router_adapters(model: Any) -> list[str]:
    """Zero and freeze the adapter PEFT put on a mixture of experts' routers (a wrapped module whose
    class is a transformers ``...Router``): with B zero the router computes exactly the base
    model's logits, and without a gradient it stays so. Returns the names of the frozen tensors."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    frozen = []
    for module_name, module in model.named_modules():
        if not isinstance(module, BaseTunerLayer) or not type(module.get_base_layer()).__name__.endswith("Router"):
            continue
        for name, param in module.named_parameters(prefix=module_name):
            if is_adapter_name(name):
                with torch.no_grad():
                    if ".lora_B." in name:
                        param.zero_()
                param.requires_grad_(False)
                frozen.append(name)
    return frozen


@contextlib.contextmanager
def adapter_off(model: Any) -> Iterator[None]:
    """The base model within the block: every LoRA layer of ``model`` skips its adapter.

    PEFT's own ``disable_adapter()`` also sets the adapter's ``requires_grad`` to False and back,
    and FSDP2 decides at its first forward (its lazy initialisation) which parameters get
    gradients: a first forward inside it leaves the adapter without a gradient reduction. So only
    the layers' switch is flipped here (``BaseTunerLayer.disable_adapters`` reads it)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [m._disable_adapters for m in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, state in zip(layers, before, strict=True):
            layer._disable_adapters = state


def is_adapter_name(name: str) -> bool:
    """Whether a parameter or state-dict name is an adapter tensor's."""
    return ".lora_A." in name or ".lora_B." in name


def saved_name(name: str) -> str:
    """A parameter name of a PEFT model (under any wrappers) as PEFT saves it."""
    return _WRAPPER_SEGMENTS.sub("", name).replace(f".{ADAPTER_NAME}.", ".")


def adapter_tensors(named: Any) -> dict[str, torch.Tensor]:
    """The adapter tensors among ``(name, tensor)`` pairs of a PEFT model, under their saved names, on the CPU."""
    return {saved_name(name): tensor.detach().to("cpu", copy=True) for name, tensor in named if is_adapter_name(name)}


def base_hf_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A PEFT model's full state dict without the adapter, under the Hugging Face model's own names."""
    prefix = "base_model.model."
    out = {}
    for name, tensor in state.items():
        name = _WRAPPER_SEGMENTS.sub("", name)
        if is_adapter_name(name):
            continue
        name = name[len(prefix):] if name.startswith(prefix) else name
        out[name.replace(".base_layer.", ".")] = tensor
    return out


def config_dict(settings: LoraSettings, base_model_path: str | None = None) -> dict[str, Any]:
    """The ``adapter_config.json`` content of an adapter trained with ``settings`` (JSON-able:
    what a generation engine in another process rebuilds the ``LoraConfig`` from)."""
    return json.loads(json.dumps(peft_config(settings, base_model_path).to_dict(), default=list))


def lora_config_of(config: dict[str, Any]) -> Any:
    """PEFT's ``LoraConfig`` rebuilt from :func:`config_dict`'s content (keys PEFT does not take left out)."""
    from peft import LoraConfig

    return LoraConfig(**{k: v for k, v in config.items() if k in LoraConfig.__dataclass_fields__})


def write_adapter(folder: str | Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """A PEFT adapter folder: ``adapter_model.safetensors`` and ``adapter_config.json`` (loadable
    with ``peft.PeftModel.from_pretrained(base, folder)`` and by vLLM's LoRA support)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / ADAPTER_FILE))
    lora_config_of(config).save_pretrained(str(folder))


def merged_hf_state(base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], hf_config: Any,
                    config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The Hugging Face weights with the adapter merged in, by PEFT's ``merge_and_unload``."""
    import torch
    from peft import get_peft_model, set_peft_model_state_dict

    from corerl.models.hf_config import auto_model_class

    model = auto_model_class("policy", hf_config).from_config(hf_config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict({k: v.to(torch.float32) for k, v in base.items()}, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or set(missing) - tied:
        raise ValueError(f"the base weights do not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.tie_weights()
    wrapped = get_peft_model(model, lora_config_of(config))
    set_peft_model_state_dict(wrapped, {k: v.to(torch.float32) for k, v in adapter.items()})
    merged = wrapped.merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}
