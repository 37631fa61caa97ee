"""A :class:`~corerl.run.tinker.engine.TinkerEngine` on one Hugging Face model with PEFT adapters.

One base model is loaded the way corerl loads a policy (a ``builtin:`` model built into the work
folder, a packaged or GGUF model converted once into corerl's model cache, or a checkpoint folder)
and frozen; or, given ``model``, the one a training backend built its own way (its
``adapter_model``: ``corerl serve RECIPE``, :mod:`corerl.run.tinker.selection`), every forward
pass then under that backend's ``forward_context``. Each training client is one PEFT LoRA adapter on it (``add_adapter``; one adapter
active per call, ``set_adapter``), with its own torch AdamW and step count. Only the active
adapter takes part in a forward and only its parameters require gradients, so a client's
``forward_backward`` and ``optim_step`` never touch another's weights, gradients or optimizer
state. Calls run one at a time (a lock).

Adapters: rank ``spec.rank``, ``lora_alpha`` :data:`LORA_ALPHA` (fixed, as Tinker keeps it, so a
learning rate carries over between ranks), no dropout, B initialised to zero (a new adapter is
the base model), A from PEFT's initialiser under ``spec.seed``. ``train_attn`` targets the linear
layers of the attention blocks, ``train_mlp`` those of the MLP blocks, ``train_unembed`` the
output projection.

Refusals about saved weights never name their place on the server's disk (the server names
the client's path for them). Saved states and sampler weights are folders: ``state.json`` (format, base model, spec, steps),
``adapter.safetensors`` (the adapter's tensors under PEFT's names without the adapter's name) and,
for a state saved with its optimizer, ``optimizer.pt`` (torch's AdamW state dict, read back with
``weights_only``). Sampler weights are a PEFT adapter folder too: ``adapter_config.json`` and
``adapter_model.safetensors`` (a hard link to ``adapter.safetensors``: the same tensors, no second
copy), which ``peft.PeftModel.from_pretrained`` and vLLM load. Sampling loads exported weights as
extra adapters, the most recently used kept (at most ``max_adapters`` of them).

Given a ``sampler`` (the ``adapter_sampler`` of the recipe's generation backend,
:class:`corerl.registry.GenerationBackend`), :meth:`PeftEngine.sample` checks the request and the
weights here and hands the sampling to it, with the exported PEFT folder. A rank above
``max_rank`` is refused when the training client is created; an adapter on the output projection
(``train_unembed``, the SDK's default) where the sampler takes none (its ``takes_unembed``) is
sampled here with torch.

Sampled tokens' logprobs are those of the distribution sampled from at the request's temperature
(``log_softmax(logits / temperature)``), before top-k/top-p truncation; at temperature 0 (greedy)
they are the model's own logprobs.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import tempfile
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file

from corerl.errors import ConfigError
from corerl.failures import first_line
from corerl.models.hf_config import auto_model_class, read_hf_config
from corerl.models.tokenizer import load_tokenizer_folder
from corerl.run.directory import resolve_model
from corerl.run.tinker.engine import (
    USER,
    AdamParams,
    Datum,
    ForwardOutput,
    LoraSpec,
    SampledSequence,
    SampleParams,
    ServiceError,
)
from corerl.run.tinker.losses import CLIP_KEYS, check_request, elementwise_loss

LORA_ALPHA = 32
PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: padded tokens (rows x longest row) one forward takes at most; more data runs in several
TOKENS_PER_MICROBATCH = 4096
STATE_FORMAT = "corerl-tinker-adapter/1"
STATE_FILE = "state.json"
ADAPTER_FILE = "adapter.safetensors"
#: PEFT's files of an adapter folder (sampler weights): what ``PeftModel.from_pretrained`` and vLLM read
PEFT_ADAPTER_FILE = "adapter_model.safetensors"
PEFT_CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.pt"
ATTENTION_BLOCKS = ("self_attn", "attn", "attention", "self_attention")
MLP_BLOCKS = ("mlp", "feed_forward", "ffn")
MAX_SAMPLES = 256
#: what torch's activation-checkpoint wrapper adds to the names inside it: left out of saved names,
#: so that weights saved with activation checkpointing load without it, and back
WRAPPED = "._checkpoint_wrapped_module"


@dataclass
class _Adapter:
    """A training client's adapter: PEFT's name for it, its spec, parameters, optimizer, steps."""

    name: str
    spec: LoraSpec
    params: list[torch.nn.Parameter]
    param_names: list[str]
    optimizer: torch.optim.AdamW
    steps: int = 0


class PeftEngine:
    """Many LoRA adapters on one base model, in this process (see the module's docstring)."""

    def __init__(self, base_model: str, *, precision: str = "float32", max_adapters: int = 16,
                 work_dir: str | Path | None = None, device: str | None = None, model: Any = None,
                 model_path: str | Path | None = None,
                 forward_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
                 sampler: Any = None, max_rank: int | None = None) -> None:
        """``model`` (with ``model_path``, the folder it was built from): a base model built
        already, on its device (``device`` is ignored), instead of one loaded here. ``sampler``:
        what samples instead of this process's torch (see the module's docstring), taking adapters
        up to rank ``max_rank``."""
        if precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {precision!r}", key="precision",
                              hint=f"use one of {', '.join(PRECISIONS)}")
        if max_adapters < 1:
            raise ConfigError(f"max_adapters must be at least 1, not {max_adapters}", key="max_adapters")
        self.base_model = base_model
        self.precision = precision
        self.max_adapters = max_adapters
        self.work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="corerl-tinker-"))
        self._forward_context = forward_context or contextlib.nullcontext
        self.sampler = sampler
        self.max_rank = max_rank
        self._sampler_lock = threading.Lock()
        if model is None:
            self.model_path = resolve_model(base_model, self.work_dir, key="base_model")
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            model = auto_model_class("policy", read_hf_config(self.model_path)).from_pretrained(
                self.model_path, dtype=PRECISIONS[precision])
            model.to(self.device)
        else:
            if model_path is None:
                raise ValueError("PeftEngine(model=...) needs the model_path it was built from")
            self.model_path = Path(model_path)
            self.device = next(model.parameters()).device
        self.tokenizer = load_tokenizer_folder(self.model_path)
        model.eval()  # no dropout: a step is a function of the data and the weights
        model.requires_grad_(False)
        self._base = model
        self._peft: PeftModel | None = None
        self._adapters: dict[str, _Adapter] = {}
        self._samplers: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._names = 0
        self._lock = threading.RLock()
        text_config = model.config.get_text_config()
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.max_length = int(getattr(text_config, "max_position_embeddings", 0) or 1 << 30)
        self._targets = self._find_targets()
        self._eos = self._eos_ids()

    # -- adapters --

    def create(self, model_id: str, spec: LoraSpec) -> None:
        with self._lock:
            if not model_id:
                raise ServiceError(USER, "model_id is empty")
            if model_id in self._adapters:
                raise ServiceError(USER, f"model {model_id!r} exists already")
            self._check_capacity()
            self._adapters[model_id] = self._new_adapter(spec)

    def delete(self, model_id: str) -> None:
        with self._lock:
            adapter = self._adapter(model_id)
            self._drop(adapter.name)
            del self._adapters[model_id]

    def info(self, model_id: str) -> dict[str, Any]:
        with self._lock:
            adapter = self._adapter(model_id)
            return {
                "model_id": model_id, "base_model": self.base_model, "is_lora": True,
                "rank": adapter.spec.rank, "lora_alpha": LORA_ALPHA, "train_mlp": adapter.spec.train_mlp,
                "train_attn": adapter.spec.train_attn, "train_unembed": adapter.spec.train_unembed,
                "steps": adapter.steps, "trainable_parameters": sum(p.numel() for p in adapter.params),
                "adapter_bytes": self._param_bytes(adapter), "optimizer_bytes": self._optimizer_bytes(adapter),
            }

    def adapter_bytes(self, model_id: str) -> int:
        with self._lock:
            return self._param_bytes(self._adapter(model_id))

    def optimizer_bytes(self, model_id: str) -> int:
        """Bytes the adapter's optimizer state takes (nothing before its first step)."""
        with self._lock:
            return self._optimizer_bytes(self._adapter(model_id))

    # -- training --

    def forward(self, model_id: str, data: list[Datum], loss_fn: str,
                loss_fn_config: dict[str, float] | None) -> ForwardOutput:
        return self._run(model_id, data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(self, model_id: str, data: list[Datum], loss_fn: str,
                         loss_fn_config: dict[str, float] | None) -> ForwardOutput:
        return self._run(model_id, data, loss_fn, loss_fn_config, backward=True)

    def optim_step(self, model_id: str, adam: AdamParams) -> dict[str, float]:
        with self._lock:
            adapter = self._adapter(model_id)
            _check_adam(adam)
            grads = [p.grad for p in adapter.params if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) \
                if grads else 0.0
            if adam.grad_clip_norm > 0 and grads:
                torch.nn.utils.clip_grad_norm_(adapter.params, adam.grad_clip_norm)
            for group in adapter.optimizer.param_groups:
                group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                             weight_decay=adam.weight_decay)
            adapter.optimizer.step()
            adapter.optimizer.zero_grad(set_to_none=True)
            adapter.steps += 1
            return {"grad_norm": norm, "learning_rate": adam.learning_rate, "step": float(adapter.steps)}

    def _run(self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
             *, backward: bool) -> ForwardOutput:
        with self._lock:
            adapter = self._adapter(model_id)
            clips = check_request(loss_fn, loss_fn_config, data, self.vocab_size, self.max_length)
            assert self._peft is not None
            self._peft.set_adapter(adapter.name)
            outputs: list[dict[str, list[float]]] = []
            total = 0.0
            for batch in _microbatches(data):
                with torch.enable_grad() if backward else torch.no_grad():
                    logps = self._target_logprobs(batch)
                    losses = []
                    for datum, logp in zip(batch, logps, strict=True):
                        inputs = self._input_tensors(datum)
                        element = elementwise_loss(loss_fn, logp, inputs, clips)
                        losses.append(element.sum())
                        outputs.append({"logprobs": logp.detach().float().cpu().tolist(),
                                        "elementwise_loss": element.detach().float().cpu().tolist()})
                    loss = torch.stack(losses).sum()
                    if backward:
                        loss.backward()
                total += float(loss.detach())
            return ForwardOutput(outputs=outputs, metrics={"loss:sum": total})

    def _target_logprobs(self, batch: list[Datum]) -> list[torch.Tensor]:
        """Each datum's target tokens' logprobs under the active adapter (right-padded batch: a
        causal model's real positions never see the padding after them)."""
        width = max(len(d.tokens) for d in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        targets = torch.zeros((len(batch), width), dtype=torch.long)
        for row, datum in enumerate(batch):
            ids[row, :len(datum.tokens)] = torch.tensor(datum.tokens, dtype=torch.long)
            targets[row, :len(datum.tokens)] = torch.tensor(
                [int(t) for t in datum.inputs["target_tokens"]], dtype=torch.long)
        ids, targets = ids.to(self.device), targets.to(self.device)
        with self._forward_context():
            logits = self._model()(input_ids=ids, use_cache=False).logits.float()
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
        return [logp[row, :len(datum.tokens)] for row, datum in enumerate(batch)]

    def _input_tensors(self, datum: Datum) -> dict[str, Any]:
        inputs: dict[str, Any] = {}
        for name, values in datum.inputs.items():
            if name == "target_tokens":
                continue
            if name in CLIP_KEYS and len(values) == 1 and len(datum.tokens) != 1:
                inputs[name] = float(values[0])
            else:
                inputs[name] = torch.tensor(values, dtype=torch.float32, device=self.device)
        return inputs

    # -- states --

    def save_state(self, model_id: str, path: Path, with_optimizer: bool = True) -> None:
        with self._lock:
            adapter = self._adapter(model_id)
            self._write(adapter, Path(path), kind="state", with_optimizer=with_optimizer)

    def export_sampler(self, model_id: str, path: Path) -> None:
        with self._lock:
            adapter = self._adapter(model_id)
            self._write(adapter, Path(path), kind="sampler", with_optimizer=False)

    def load_state(self, model_id: str, path: Path, with_optimizer: bool) -> None:
        with self._lock:
            if not model_id:
                raise ServiceError(USER, "model_id is empty")
            state = self._read_state(Path(path))
            if with_optimizer and not state.get("with_optimizer"):
                raise ServiceError(USER, "this state was saved without its optimizer; "
                                         "load it without the optimizer")
            if model_id not in self._adapters:
                self._check_capacity()
            adapter = self._new_adapter(state["spec"])
            try:
                self._load_tensors(adapter, Path(path))
                if with_optimizer:
                    saved = torch.load(Path(path) / OPTIMIZER_FILE, map_location=self.device, weights_only=True)
                    adapter.optimizer.load_state_dict(saved)
                adapter.steps = int(state.get("steps", 0))
            except BaseException as exc:
                self._drop(adapter.name)
                if isinstance(exc, ServiceError):
                    raise
                raise _unreadable(exc, path) from exc
            old = self._adapters.get(model_id)
            self._adapters[model_id] = adapter
            if old is not None:
                self._drop(old.name)

    def _write(self, adapter: _Adapter, path: Path, *, kind: str, with_optimizer: bool) -> None:
        path.mkdir(parents=True, exist_ok=True)
        tensors = {name: p.detach().to("cpu", copy=True).contiguous()
                   for name, p in zip(adapter.param_names, adapter.params, strict=True)}
        save_file(tensors, str(path / ADAPTER_FILE))
        if with_optimizer:
            torch.save(adapter.optimizer.state_dict(), path / OPTIMIZER_FILE)
        state = {"format": STATE_FORMAT, "kind": kind, "base_model": self.base_model, "spec": asdict(adapter.spec),
                 "steps": adapter.steps, "with_optimizer": with_optimizer, "lora_alpha": LORA_ALPHA}
        if kind == "sampler":
            self._write_peft(path, adapter.spec)
        (path / STATE_FILE).write_text(json.dumps(state, indent=1))  # last: its presence marks a whole save

    def _write_peft(self, path: Path, spec: LoraSpec) -> None:
        """PEFT's files of the adapter whose tensors ``path`` holds: ``adapter_config.json`` and
        ``adapter_model.safetensors``, a hard link to ``adapter.safetensors`` (a copy where the
        folder's file system has no links)."""
        import shutil

        peft_file = path / PEFT_ADAPTER_FILE
        peft_file.unlink(missing_ok=True)
        try:
            peft_file.hardlink_to(path / ADAPTER_FILE)
        except OSError:
            shutil.copyfile(path / ADAPTER_FILE, peft_file)
        self._lora_config(spec).save_pretrained(str(path))

    def _read_state(self, path: Path) -> dict[str, Any]:
        """The saved state's ``state.json`` with its spec as a :class:`LoraSpec`; one line when
        there is none, it is not ours, or it is for another base model."""
        try:
            state = json.loads((path / STATE_FILE).read_text())
        except (OSError, ValueError):
            raise ServiceError(USER, "no saved weights there") from None
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ServiceError(USER, "that path holds no weights this server saved")
        if state.get("base_model") != self.base_model:
            raise ServiceError(USER, f"these weights are for base model {state.get('base_model')!r}, "
                                     f"not this server's {self.base_model!r}")
        try:
            state["spec"] = LoraSpec(**state["spec"])
        except (KeyError, TypeError):
            raise ServiceError(USER, "these saved weights hold no readable LoRA spec") from None
        return state

    def _load_tensors(self, adapter: _Adapter, path: Path) -> None:
        saved = load_file(str(path / ADAPTER_FILE), device=str(self.device))
        expected = dict(zip(adapter.param_names, adapter.params, strict=True))
        if set(saved) != set(expected):
            extra = sorted(set(saved) ^ set(expected))
            raise ServiceError(USER, f"these weights do not fit their spec on this base model "
                                     f"({len(extra)} tensors differ, e.g. {extra[0]})")
        with torch.no_grad():
            for name, param in expected.items():
                if saved[name].shape != param.shape:
                    raise ServiceError(USER, f"these weights' {name} is {tuple(saved[name].shape)}, "
                                             f"this base model needs {tuple(param.shape)}")
                param.copy_(saved[name])

    # -- sampling --

    def sample(self, sampler_path: Path | None, prompt: list[int], num_samples: int,
               params: SampleParams) -> list[SampledSequence]:
        if self.sampler is not None:
            return self._sample_outside(sampler_path, prompt, num_samples, params)
        with self._lock:
            self._check_sample(prompt, num_samples, params)
            return self._sample_here(sampler_path, prompt, num_samples, params)

    def _sample_here(self, sampler_path: Path | None, prompt: list[int], num_samples: int,
                     params: SampleParams) -> list[SampledSequence]:
        """Samples with torch in this process (the caller holds the lock)."""
        if sampler_path is None:
            scope = self._peft.disable_adapter() if self._peft is not None else contextlib.nullcontext()
            with scope:
                return self._generate(prompt, num_samples, params)
        name = self._sampler(Path(sampler_path))
        assert self._peft is not None
        self._peft.set_adapter(name)
        return self._generate(prompt, num_samples, params)

    def _sample_outside(self, sampler_path: Path | None, prompt: list[int], num_samples: int,
                        params: SampleParams) -> list[SampledSequence]:
        """Samples by :attr:`sampler` from the PEFT folder of the exported weights (checked here
        first: this server's, for this base model); training goes on meanwhile."""
        with self._lock:
            self._check_sample(prompt, num_samples, params)
            folder = None
            if sampler_path is not None:
                folder = Path(sampler_path)
                state = self._read_state(folder)
                if state["spec"].train_unembed and not getattr(self.sampler, "takes_unembed", False):
                    return self._sample_here(folder, prompt, num_samples, params)  # the output projection's adapter
                self._check_spec(state["spec"])
                if not (folder / PEFT_ADAPTER_FILE).is_file() or not (folder / PEFT_CONFIG_FILE).is_file():
                    self._write_peft(folder, state["spec"])  # weights exported before the PEFT files were
        with self._sampler_lock:
            out = self.sampler.sample(None if folder is None else str(folder), [int(t) for t in prompt], num_samples,
                                      **asdict(params))
        return [SampledSequence(tokens=[int(t) for t in o["tokens"]], logprobs=[float(v) for v in o["logprobs"]],
                                stop_reason=str(o["stop_reason"])) for o in out]

    def close(self) -> None:
        """Stop the sampler's engine, where there is one."""
        close = getattr(self.sampler, "close", None)
        if callable(close):
            close()

    def _sampler(self, path: Path) -> str:
        """PEFT's name of the adapter holding the sampler weights at ``path``, loaded once (until
        evicted, least recently used first)."""
        try:
            key = (str(path.resolve()), (path / ADAPTER_FILE).stat().st_mtime_ns)
        except OSError:
            raise ServiceError(USER, "no sampler weights there") from None
        if key in self._samplers:
            self._samplers.move_to_end(key)
            return self._samplers[key]
        state = self._read_state(path)
        adapter = self._new_adapter(state["spec"], prefix="s")
        try:
            self._load_tensors(adapter, path)
        except BaseException as exc:
            self._drop(adapter.name)
            if isinstance(exc, ServiceError):
                raise
            raise _unreadable(exc, path) from exc
        for stale in [k for k in self._samplers if k[0] == key[0]]:  # that folder's earlier contents
            self._drop(self._samplers.pop(stale))
        self._samplers[key] = adapter.name
        while len(self._samplers) > self.max_adapters:
            _, evicted = self._samplers.popitem(last=False)
            self._drop(evicted)
        return adapter.name

    @torch.no_grad()
    def _generate(self, prompt: list[int], num_samples: int, params: SampleParams) -> list[SampledSequence]:
        model = self._model()
        generator = torch.Generator(device=self.device)
        generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        stops = set(params.stop_tokens) | (self._eos if params.stop_at_eos else set())
        ids = torch.tensor([prompt] * num_samples, dtype=torch.long, device=self.device)
        with self._forward_context():
            out = model(input_ids=ids, use_cache=True)
        tokens: list[list[int]] = [[] for _ in range(num_samples)]
        logprobs: list[list[float]] = [[] for _ in range(num_samples)]
        reasons = ["length"] * num_samples
        done = [False] * num_samples
        for step in range(params.max_tokens):
            picked, picked_logprobs = _pick(out.logits[:, -1].float(), params, generator)
            for row in range(num_samples):
                if done[row]:
                    continue
                token = int(picked[row])
                tokens[row].append(token)
                logprobs[row].append(float(picked_logprobs[row]))
                if token in stops or (params.stop_strings and self._hits_stop_string(tokens[row], params)):
                    done[row], reasons[row] = True, "stop"
            if all(done) or step + 1 == params.max_tokens:
                break
            with self._forward_context():
                out = model(input_ids=picked.unsqueeze(-1), past_key_values=out.past_key_values, use_cache=True)
        return [SampledSequence(tokens=t, logprobs=lp, stop_reason=r)
                for t, lp, r in zip(tokens, logprobs, reasons, strict=True)]

    def _hits_stop_string(self, tokens: list[int], params: SampleParams) -> bool:
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        return any(stop and stop in text for stop in params.stop_strings)

    def _check_sample(self, prompt: list[int], num_samples: int, params: SampleParams) -> None:
        if not prompt:
            raise ServiceError(USER, "prompt has no tokens")
        for token in prompt:
            if not 0 <= int(token) < self.vocab_size:
                raise ServiceError(USER, f"prompt: token {token} is outside the model's vocabulary of {self.vocab_size}")
        for token in params.stop_tokens:
            if not 0 <= int(token) < self.vocab_size:
                raise ServiceError(USER, f"sampling_params.stop: token {token} is outside the model's vocabulary "
                                         f"of {self.vocab_size}")
        if not 1 <= num_samples <= MAX_SAMPLES:
            raise ServiceError(USER, f"num_samples must be between 1 and {MAX_SAMPLES}, not {num_samples}")
        if params.max_tokens < 1:
            raise ServiceError(USER, f"sampling_params.max_tokens must be at least 1, not {params.max_tokens}")
        longest = min(self.max_length, int(getattr(self.sampler, "max_length", self.max_length)))
        if len(prompt) + params.max_tokens > longest:
            raise ServiceError(USER, f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                                     f"{'model' if longest == self.max_length else 'sampler'}'s context of {longest}"
                                     + ("" if longest == self.max_length else
                                        " (the server's recipe sets it: policy.max_seq_length)"))
        if not math.isfinite(params.temperature) or params.temperature < 0:
            raise ServiceError(USER, f"sampling_params.temperature must be >= 0, not {params.temperature}")
        if not 0 < params.top_p <= 1:
            raise ServiceError(USER, f"sampling_params.top_p must be in (0, 1], not {params.top_p}")
        if params.top_k < -1:
            raise ServiceError(USER, f"sampling_params.top_k must be -1 (no limit) or positive, not {params.top_k}")

    # -- helpers --

    def _model(self) -> Any:
        return self._peft if self._peft is not None else self._base

    def _adapter(self, model_id: str) -> _Adapter:
        adapter = self._adapters.get(model_id)
        if adapter is None:
            raise ServiceError(USER, f"unknown model {model_id!r}")
        return adapter

    def _check_capacity(self) -> None:
        if len(self._adapters) >= self.max_adapters:
            raise ServiceError(USER, f"this server holds {self.max_adapters} training adapters already, its most; "
                                     "delete one, or start the server with more")

    def _check_spec(self, spec: LoraSpec) -> list[str]:
        """The module names the spec's adapter wraps; one line for a spec the model cannot take."""
        targets = [name for kind, names in self._targets.items() if getattr(spec, f"train_{kind}") for name in names]
        if not targets:
            wanted = [kind for kind in self._targets if getattr(spec, f"train_{kind}")]
            raise ServiceError(USER, "lora_config trains no layer: set train_mlp, train_attn or train_unembed"
                               if not wanted else f"lora_config: this base model has no {' or '.join(wanted)} "
                                                  "linear layers to train")
        limit = min(min(self._linear(name).in_features, self._linear(name).out_features) for name in targets)
        if isinstance(spec.rank, bool) or not isinstance(spec.rank, int) or not 1 <= spec.rank <= limit:
            raise ServiceError(USER, f"lora_config.rank {spec.rank!r} is not one this base model can take: "
                                     f"use 1 to {limit}")
        if self.sampler is not None and self.max_rank is not None and spec.rank > self.max_rank:
            raise ServiceError(USER, f"lora_config.rank {spec.rank} is more than this server samples: use 1 to "
                                     f"{min(limit, self.max_rank)}, or restart it with a larger --max-lora-rank")
        return targets

    def _lora_config(self, spec: LoraSpec) -> LoraConfig:
        return LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=self._check_spec(spec),
                          bias="none")

    def _new_adapter(self, spec: LoraSpec, prefix: str = "t") -> _Adapter:
        """A fresh PEFT adapter for ``spec`` (B zero, A drawn under ``spec.seed``) and its optimizer;
        torch's global random state is left as it was."""
        config = self._lora_config(spec)
        self._names += 1
        name = f"{prefix}{self._names}"
        seed = spec.seed if spec.seed is not None else secrets.randbits(63)
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT's note on tied embeddings: the adapter leaves them as they are
            torch.manual_seed(seed)
            if self._peft is None:
                self._peft = get_peft_model(self._base, config, adapter_name=name)
            else:
                self._peft.add_adapter(name, config)
        marker = f".{name}."
        named = [(n, p) for n, p in self._peft.named_parameters() if marker in n]
        params = [p for _, p in named]
        optimizer = torch.optim.AdamW(params, lr=AdamParams().learning_rate, betas=(0.9, 0.95), eps=1e-12,
                                      weight_decay=0.0)
        return _Adapter(name=name, spec=spec, params=params, optimizer=optimizer,
                        param_names=[n.replace(marker, ".").replace(WRAPPED, "") for n, _ in named])

    def _drop(self, name: str) -> None:
        if self._peft is not None and name in self._peft.peft_config:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # PEFT's note that another adapter is now the active one
                self._peft.delete_adapter(name)

    def _find_targets(self) -> dict[str, list[str]]:
        """The base model's linear layers by kind: ``attn``, ``mlp``, ``unembed``."""
        output = self._base.get_output_embeddings()
        found: dict[str, list[str]] = {"mlp": [], "attn": [], "unembed": []}
        for name, module in self._base.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            parts = name.split(".")
            if module is output:
                found["unembed"].append(name)
            elif any(part in ATTENTION_BLOCKS for part in parts):
                found["attn"].append(name)
            elif any(part in MLP_BLOCKS for part in parts):
                found["mlp"].append(name)
        return found

    def _linear(self, name: str) -> torch.nn.Linear:
        module = self._base.get_submodule(name)
        return getattr(module, "base_layer", module)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for value in (getattr(self.tokenizer, "eos_token_id", None),
                      getattr(getattr(self._base, "generation_config", None), "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    @staticmethod
    def _param_bytes(adapter: _Adapter) -> int:
        return sum(p.numel() * p.element_size() for p in adapter.params)

    @staticmethod
    def _optimizer_bytes(adapter: _Adapter) -> int:
        return sum(v.numel() * v.element_size() for state in adapter.optimizer.state.values()
                   for v in state.values() if isinstance(v, torch.Tensor))


def _microbatches(data: list[Datum]) -> Iterator[list[Datum]]:
    """``data`` in order, in runs whose padded size stays within :data:`TOKENS_PER_MICROBATCH`."""
    batch: list[Datum] = []
    width = 0
    for datum in data:
        wider = max(width, len(datum.tokens))
        if batch and wider * (len(batch) + 1) > TOKENS_PER_MICROBATCH:
            yield batch
            batch, wider = [], len(datum.tokens)
        batch.append(datum)
        width = wider
    if batch:
        yield batch


def _pick(logits: torch.Tensor, params: SampleParams, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of each row and its logprob (see the module's docstring)."""
    if params.temperature == 0:
        picked = logits.argmax(-1)
        return picked, logits.log_softmax(-1).gather(-1, picked.unsqueeze(-1)).squeeze(-1)
    scaled = logits / params.temperature
    logprobs = scaled.log_softmax(-1)
    kept = scaled.clone()
    if params.top_k > 0 and params.top_k < kept.shape[-1]:
        kth = kept.topk(params.top_k, dim=-1).values[:, -1:]
        kept = kept.masked_fill(kept < kth, float("-inf"))
    if params.top_p < 1:
        ordered, order = kept.sort(dim=-1, descending=True)
        before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # mass of the tokens ranked above
        drop = before >= params.top_p
        kept = kept.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    picked = torch.multinomial(kept.softmax(-1), 1, generator=generator).squeeze(-1)
    return picked, logprobs.gather(-1, picked.unsqueeze(-1)).squeeze(-1)


def _check_adam(adam: AdamParams) -> None:
    checks = [("learning_rate", adam.learning_rate >= 0), ("beta1", 0 <= adam.beta1 < 1),
              ("beta2", 0 <= adam.beta2 < 1), ("eps", adam.eps >= 0), ("weight_decay", adam.weight_decay >= 0),
              ("grad_clip_norm", adam.grad_clip_norm >= 0)]
    for key, ok in checks:
        value = getattr(adam, key)
        if not ok or not math.isfinite(value):
            bound = "in [0, 1)" if key.startswith("beta") else ">= 0"
            raise ServiceError(USER, f"adam_params.{key} must be {bound}, not {value}")


def _unreadable(exc: BaseException, path: Path) -> BaseException:
    """A file error while reading saved weights as one line for the user; anything else (an
    interrupt, running out of memory) as it was."""
    if isinstance(exc, Exception) and not isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return ServiceError(USER, f"cannot read these saved weights: {first_line(exc)}")
    return exc
