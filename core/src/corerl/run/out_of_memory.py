"""Running out of memory, said in one line: the phase, what was asked for, what was free, and the
keys that lower it (never "this is a bug").

Recognised anywhere in an exception's chain: Python's ``MemoryError``, torch's CPU allocator
failure (``DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes``), torch's
``OutOfMemoryError`` on a GPU, and Ray's ``OutOfMemoryError`` (its memory monitor killed a worker).
The phase is read from the traceback: the last frame of a generation, logprob, training or refit
call.
"""

from __future__ import annotations

import re
import traceback

#: a function name in the traceback -> the phase it is, and the keys that lower its memory
PHASES: tuple[tuple[str, str, str], ...] = (
    ("generate", "generating", "algorithm.batch_size, algorithm.num_generations_per_prompt, "
                               "policy.generation.max_new_tokens, policy.max_logits_mb"),
    ("logprobs", "scoring logprobs", "policy.logprob_micro_batch_size, policy.max_logits_mb, policy.max_seq_length"),
    ("values", "scoring values", "critic.value_micro_batch_size, policy.max_seq_length"),
    ("train_step", "training", "policy.train_micro_batch_size, policy.max_logits_mb, policy.max_seq_length, "
                               "policy.activation_checkpointing"),
    ("update_weights", "refitting the generation engine", "the KV cache in the generation backend's section "
                                                          "(policy.generation.<backend>_cfg), policy.offload.policy"),
    ("load_hf", "loading the model", "policy.precision, policy.offload.policy"),
)
_ASKED = (re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE),
          re.compile(r"Tried to allocate ([\d.]+ [KMGT]iB)"))
_GENERAL_KEYS = "policy.train_micro_batch_size, policy.max_logits_mb, algorithm.batch_size"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory failure."""
    name, text = type(exc).__name__, str(exc)
    return (isinstance(exc, MemoryError) or name == "OutOfMemoryError"
            or "can't allocate memory" in text or "CUDA out of memory" in text)


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def _asked(text: str) -> str | None:
    for pattern in _ASKED:
        found = pattern.search(text)
        if found:
            value = found.group(1)
            return _size(int(value)) if value.isdigit() else value
    return None


def _free(text: str) -> str:
    found = re.search(r"of which ([\d.]+ [KMGT]iB) is free", text)  # a GPU's
    if found:
        return f"{found.group(1)} free on the GPU"
    try:
        import psutil

        return f"{_size(psutil.virtual_memory().available)} of {_size(psutil.virtual_memory().total)} free now"
    except ImportError:  # pragma: no cover - psutil comes with Ray
        return "free memory unknown"


def _phase(chain: list[BaseException]) -> tuple[str, str]:
    names = [frame.name for exc in chain for frame in traceback.extract_tb(exc.__traceback__)]
    text = " ".join(str(exc) for exc in chain)  # a remote traceback arrives as text
    for name, phase, keys in reversed(PHASES):
        if name in names or f" in {name}" in text or f".{name}(" in text:
            return phase, keys
    return "running", _GENERAL_KEYS


def out_of_memory_line(exc: BaseException) -> str | None:
    """The one line for an out-of-memory failure in ``exc``'s chain; None for anything else."""
    chain = _chain(exc)
    failure = next((e for e in chain if is_out_of_memory(e)), None)
    if failure is None:
        return None
    text = str(failure)
    phase, keys = _phase(chain)
    asked = _asked(text)
    killed = " (Ray's memory monitor killed a worker)" if type(failure).__name__ == "OutOfMemoryError" and \
        "ray" in type(failure).__module__ else ""
    what = f"it asked for {asked} more, " if asked else ""
    return f"out of memory while {phase}{killed}: {what}{_free(text)}; lower {keys}"
