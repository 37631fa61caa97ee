"""The Tinker SDK's request and response bodies, read into the engine's plain values and written
back (issue 76; the protocol: docs/serve.md).

Most bodies are JSON; ``forward_backward`` arrives as the SDK's protobuf ``ForwardBackwardRequest``
and its result, like a sample's, goes back as protobuf (``ForwardBackwardOutput``,
``SampleResponse``). The protobuf classes are the SDK's own generated module
(``tinker.proto.tinker_public_pb2``), imported when first needed: the ``tinker`` package imports
torch, and nothing here may at import time. Every reader refuses what it cannot take with a
:class:`~corerl.run.tinker.engine.ServiceError` of category ``user`` whose one line names the
request field (``forward_backward.data[2].loss_fn_inputs.weights: ...``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

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

#: a saved state's or sampler's name: what the SDK user passes to save_state / save_weights_for_sampler
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: what the SDK computes for a training client: ``{session_id}:train:{model_seq_id}``
MODEL_ID_PATTERN = re.compile(r"^([0-9a-f]{32}):train:(\d{1,9})$")
#: a sampling session: ``{session_id}:sample:{sampling_session_seq_id}``
SAMPLER_ID_PATTERN = re.compile(r"^([0-9a-f]{32}):sample:(\d{1,12})$")
#: ``tinker://<model id>/<kind>/<name>``, the kinds this server writes
PATH_KINDS = ("weights", "sampler_weights")

_PB: Any = None


def pb() -> Any:
    """The SDK's generated protobuf module (imported once, on first use)."""
    global _PB
    if _PB is None:
        from tinker.proto import tinker_public_pb2

        _PB = tinker_public_pb2
    return _PB


def refuse(where: str, message: str) -> ServiceError:
    """A user error naming the request field ``where``."""
    return ServiceError(USER, f"{where}: {message}")


def error_body(category: str, message: str) -> dict[str, str]:
    """The SDK's shape for a failed request (``RequestFailedError`` on the client)."""
    return {"error": message, "category": category}


# ---------------------------------------------------------------------------------------------- ids


def model_id(session_id: str, seq: int) -> str:
    return f"{session_id}:train:{seq}"


def sampler_id(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


@dataclass(frozen=True)
class CheckpointPath:
    """A ``tinker://`` path this server hands out: the model that saved it, which kind, the name."""

    model_id: str
    session_id: str
    model_seq: int
    kind: str
    name: str

    def __str__(self) -> str:
        return f"tinker://{self.model_id}/{self.kind}/{self.name}"


def checkpoint_path(model: str, kind: str, name: str) -> CheckpointPath:
    match = MODEL_ID_PATTERN.match(model)
    assert match is not None, model
    return CheckpointPath(model, match.group(1), int(match.group(2)), kind, name)


def parse_path(text: Any, where: str) -> CheckpointPath:
    """``tinker://<model id>/<weights|sampler_weights>/<name>`` as this server writes them."""
    if not isinstance(text, str) or not text.startswith("tinker://"):
        raise refuse(where, f"{text!r} is not a tinker:// path; pass a path save_state or "
                            "save_weights_for_sampler returned")
    parts = text[len("tinker://"):].split("/")
    if len(parts) != 3 or not MODEL_ID_PATTERN.match(parts[0]) or parts[1] not in PATH_KINDS \
            or not NAME_PATTERN.match(parts[2]):
        raise refuse(where, f"{text} is not a path this server wrote (tinker://<model id>/weights/<name> or "
                            "tinker://<model id>/sampler_weights/<name>)")
    return checkpoint_path(parts[0], parts[1], parts[2])


def checked_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise refuse(where, f"{value!r} is not a usable name; use letters, digits, '.', '_' and '-' "
                            "(up to 128, not starting with '.', '_' or '-')")
    return value


# --------------------------------------------------------------------------------------------- JSON


class Fields:
    """A JSON request body read field by field; a missing or mistyped field is refused in one line."""

    def __init__(self, body: Any, where: str) -> None:
        if not isinstance(body, dict):
            raise refuse(where, f"the body must be a JSON object, not {type(body).__name__}")
        self.body = body
        self.where = where

    def _get(self, name: str, required: bool) -> Any:
        value = self.body.get(name)
        if value is None and required:
            raise refuse(f"{self.where}.{name}", "missing")
        return value

    def str(self, name: str, required: bool = True) -> Any:
        value = self._get(name, required)
        if value is not None and not isinstance(value, str):
            raise refuse(f"{self.where}.{name}", f"expected a string, got {value!r}")
        return value

    def int(self, name: str, required: bool = True, *, minimum: int | None = None) -> Any:
        value = self._get(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise refuse(f"{self.where}.{name}", f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise refuse(f"{self.where}.{name}", f"must be at least {minimum}, got {value}")
        return value

    def float(self, name: str, default: float) -> float:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise refuse(f"{self.where}.{name}", f"expected a finite number, got {value!r}")
        return float(value)

    def bool(self, name: str, default: bool) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise refuse(f"{self.where}.{name}", f"expected true or false, got {value!r}")
        return value

    def object(self, name: str, required: bool = True) -> Fields | None:
        value = self._get(name, required)
        return None if value is None else Fields(value, f"{self.where}.{name}")


def lora_spec(body: Fields) -> LoraSpec:
    """``create_model.lora_config``: rank and which modules; ``optimizer_config`` must be Adam's."""
    config = body.object("lora_config")
    assert config is not None
    spec = LoraSpec(rank=config.int("rank", minimum=1), train_mlp=config.bool("train_mlp", True),
                    train_attn=config.bool("train_attn", True), train_unembed=config.bool("train_unembed", True),
                    seed=config.int("seed", required=False))
    if not (spec.train_mlp or spec.train_attn or spec.train_unembed):
        raise refuse(f"{config.where}", "train_mlp, train_attn and train_unembed are all false: nothing to train")
    optimizer_type(body, "optimizer_config")
    return spec


def optimizer_type(body: Fields, name: str) -> None:
    optimizer = body.object(name, required=False)
    if optimizer is not None and optimizer.body.get("type", "adamw") not in ("adam", "adamw"):
        raise refuse(f"{optimizer.where}.type", f"{optimizer.body.get('type')!r} is not served here; "
                                                 "only Adam (AdamParams on each optim_step)")


def adam_params(body: Fields) -> AdamParams:
    """``optim_step.adam_params`` (the SDK's defaults where a field is left out)."""
    if body.body.get("adam_params") is None and body.body.get("optimizer_params") is not None:
        kind = (body.body["optimizer_params"] or {}).get("type") if isinstance(body.body["optimizer_params"], dict) \
            else None
        raise refuse(f"{body.where}.optimizer_params", f"optimizer {kind!r} is not served here; pass AdamParams")
    adam = body.object("adam_params")
    assert adam is not None
    defaults = AdamParams()
    params = AdamParams(learning_rate=adam.float("learning_rate", defaults.learning_rate),
                        beta1=adam.float("beta1", defaults.beta1), beta2=adam.float("beta2", defaults.beta2),
                        eps=adam.float("eps", defaults.eps), weight_decay=adam.float("weight_decay", 0.0),
                        grad_clip_norm=adam.float("grad_clip_norm", 0.0))
    for name in ("beta1", "beta2"):
        if not 0.0 <= getattr(params, name) < 1.0:
            raise refuse(f"{adam.where}.{name}", f"must be in [0, 1), got {getattr(params, name)}")
    for name in ("learning_rate", "eps", "weight_decay", "grad_clip_norm"):
        if getattr(params, name) < 0:
            raise refuse(f"{adam.where}.{name}", f"must not be negative, got {getattr(params, name)}")
    return params


def prompt_tokens(body: Fields, name: str = "prompt") -> list[int]:
    """A ``ModelInput``'s tokens: its ``encoded_text`` chunks joined (no images here)."""
    prompt = body.object(name)
    assert prompt is not None
    chunks = prompt.body.get("chunks")
    if not isinstance(chunks, list) or not chunks:
        raise refuse(f"{prompt.where}.chunks", "expected a non-empty list of chunks")
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise refuse(f"{prompt.where}.chunks[{i}]", f"{kind!r} chunks are not served here; only encoded_text "
                                                        "(a text-only base model)")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise refuse(f"{prompt.where}.chunks[{i}].tokens", "expected a list of token ids")
        tokens.extend(ids)
    if not tokens:
        raise refuse(f"{prompt.where}", "no tokens")
    return tokens


#: asample fields that ask for what this server does not compute; (name, value meaning "off")
_SAMPLE_EXTRAS = (("prompt_logprobs", False), ("topk_prompt_logprobs", 0), ("topk_sample_logprobs", 0),
                  ("prompt_alt_tokens_k", 0), ("target_prompt_logprobs", None), ("prompt_logprobs_last_n", None))


def sample_params(body: Fields, *, max_tokens_limit: int) -> SampleParams:
    """``asample.sampling_params``: ``stop`` absent means the tokenizer's EOS; given (``[]``
    included), only the stops it lists."""
    for name, off in _SAMPLE_EXTRAS:
        if body.body.get(name) not in (off, None):
            raise refuse(f"{body.where}.{name}", "not served here (sampled tokens' own logprobs only; "
                                                 "compute_logprobs and top-k logprobs are not)")
    params = body.object("sampling_params")
    assert params is not None
    max_tokens = params.int("max_tokens", required=False, minimum=1)
    if max_tokens is None:
        max_tokens = max_tokens_limit
    if max_tokens > max_tokens_limit:
        raise refuse(f"{params.where}.max_tokens", f"{max_tokens} is over this server's limit of "
                                                   f"{max_tokens_limit} (corerl serve --max-sample-tokens)")
    stop = params.body.get("stop")
    stop_tokens: list[int] = []
    stop_strings: list[str] = []
    if stop is None:
        pass
    elif isinstance(stop, str):
        stop_strings = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop_strings = list(stop)
    elif isinstance(stop, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        stop_tokens = list(stop)
    else:
        raise refuse(f"{params.where}.stop", "expected a string, a list of strings or a list of token ids")
    temperature = params.float("temperature", 1.0)
    top_p = params.float("top_p", 1.0)
    top_k = params.int("top_k", required=False)
    if temperature < 0:
        raise refuse(f"{params.where}.temperature", f"must not be negative, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise refuse(f"{params.where}.top_p", f"must be in (0, 1], got {top_p}")
    if top_k is not None and (top_k == 0 or top_k < -1):
        raise refuse(f"{params.where}.top_k", f"must be -1 (no limit) or positive, got {top_k}")
    return SampleParams(max_tokens=max_tokens, temperature=temperature, top_k=-1 if top_k is None else top_k,
                        top_p=top_p, seed=params.int("seed", required=False), stop_tokens=stop_tokens,
                        stop_strings=stop_strings, stop_at_eos=stop is None)


# ----------------------------------------------------------------------------------------- protobuf


@dataclass
class ForwardBackwardCall:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str
    seq_id: int
    forward_only: bool
    loss_fn: str
    loss_fn_config: dict[str, float] | None
    data: list[Datum]


def read_forward_backward(raw: bytes, content_encoding: str | None) -> Any:
    """The protobuf message of a ``forward_backward`` body (zstd-compressed when the header says so)."""
    where = "forward_backward"
    if content_encoding and content_encoding.strip().lower() not in ("identity", ""):
        raise refuse(where, f"Content-Encoding {content_encoding!r} is not served here; this server's client "
                            "config leaves proto_compress_fwdbwd off")
    message = pb().ForwardBackwardRequest()
    try:
        message.ParseFromString(raw)
    except Exception as exc:  # protobuf's DecodeError
        raise refuse(where, f"the body is not a ForwardBackwardRequest protobuf ({type(exc).__name__})") from None
    if not MODEL_ID_PATTERN.match(message.model_id):
        raise refuse(f"{where}.model_id", f"{message.model_id!r} is not a model this server created")
    return message


#: the protobuf DType values and their little-endian numpy types (4: bfloat16, read as its bits)
_DTYPES = {1: "<f4", 2: "<i8", 3: "<i4", 4: "<u2"}


def _tensor(tensor: Any, where: str) -> list[float]:
    import numpy as np

    if tensor.HasField("sparse_csr"):
        raise refuse(where, "sparse (2-D) inputs are not served here; send one value per token")
    if tensor.dtype not in _DTYPES:
        raise refuse(where, f"unknown dtype {tensor.dtype}")
    dtype = np.dtype(_DTYPES[tensor.dtype])
    if len(tensor.dense) % dtype.itemsize:
        raise refuse(where, f"{len(tensor.dense)} bytes is not a whole number of {dtype.name} values")
    values = np.frombuffer(tensor.dense, dtype=dtype)
    if tensor.dtype == 4:  # bfloat16: the upper half of a float32
        values = (values.astype(np.uint32) << 16).view(np.float32)
    shape = list(tensor.shape)
    if len([d for d in shape if d != 1]) > 1:
        raise refuse(where, f"shape {shape}: only one value per token is served here (1-D inputs)")
    if shape and int(np.prod(shape)) != values.size:
        raise refuse(where, f"shape {shape} does not match its {values.size} values")
    return values.astype(np.float64).tolist()


def forward_backward_call(message: Any) -> ForwardBackwardCall:
    """The engine's values from a parsed ``ForwardBackwardRequest``."""
    import numpy as np

    where = "forward_backward"
    loss_fn = message.loss_fn  # the engine refuses a loss it does not compute, and inputs that do not fit it
    config: dict[str, float] = {}
    if len(message.loss_fn_config_v2):
        for key, value in message.loss_fn_config_v2.items():
            if value.WhichOneof("value") != "number":
                raise refuse(f"{where}.loss_fn_config.{key}", "only numbers are served here")
            config[key] = float(value.number)
    else:
        config = {key: float(value) for key, value in message.loss_fn_config.items()}
    if not len(message.data):
        raise refuse(f"{where}.data", "no datums")
    data: list[Datum] = []
    for i, datum in enumerate(message.data):
        at = f"{where}.data[{i}]"
        tokens: list[int] = []
        for j, chunk in enumerate(datum.model_input):
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise refuse(f"{at}.model_input.chunks[{j}]", f"{kind!r} chunks are not served here; only "
                                                              "encoded_text (a text-only base model)")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise refuse(f"{at}.model_input.chunks[{j}]", "token bytes are not whole int32 values")
            tokens.extend(np.frombuffer(raw, dtype="<i4").tolist())
        if not tokens:
            raise refuse(f"{at}.model_input", "no tokens")
        inputs = {key: _tensor(tensor, f"{at}.loss_fn_inputs.{key}") for key, tensor in datum.loss_fn_inputs.items()}
        data.append(Datum(tokens=tokens, inputs=inputs))
    return ForwardBackwardCall(model_id=message.model_id, seq_id=int(message.seq_id),
                               forward_only=bool(message.forward_only), loss_fn=loss_fn,
                               loss_fn_config=config or None, data=data)


def forward_output_bytes(output: ForwardOutput) -> bytes:
    """``ForwardBackwardOutput``: one record of every per-datum output array (float32) and the metrics."""
    import numpy as np

    message = pb().ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in output.metrics.items():
        message.metrics[key] = float(value)
    record = message.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(output.outputs))
    for key in sorted({k for row in output.outputs for k in row}):
        arrays = [np.asarray(row.get(key, ()), dtype="<f4") for row in output.outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype("<i8")
        field = record.fields[key]
        field.data = b"".join(a.tobytes() for a in arrays)
        field.offsets = offsets.tobytes()
        field.dtype = pb().DTYPE_FLOAT32
    return message.SerializeToString()


def sample_response_bytes(sequences: list[SampledSequence]) -> bytes:
    """``SampleResponse``: each sequence's tokens (int32), logprobs (float32) and stop reason."""
    import numpy as np

    module = pb()
    reasons = {"stop": module.STOP_REASON_STOP, "length": module.STOP_REASON_LENGTH}
    message = module.SampleResponse()
    for sequence in sequences:
        out = message.sequences.add()
        out.stop_reason = reasons[sequence.stop_reason]
        out.tokens = np.asarray(sequence.tokens, dtype="<i4").tobytes()
        out.logprobs = np.asarray(sequence.logprobs, dtype="<f4").tobytes()
    return message.SerializeToString()
