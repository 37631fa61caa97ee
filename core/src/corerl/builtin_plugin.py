"""The core's own plugin: components that need no extra package.

Always registered under the plugin name ``corerl``, whatever ``CORERL_LOAD_PLUGINS`` says.
"""

from __future__ import annotations

from collections.abc import Callable

from corerl.hookspecs import hookimpl
from corerl.pending import pending_engine
from corerl.registry import GenerationBackend, OffloadPolicy, Reward, SequencePacker, Task

DEFAULT_PACKER = "modified_first_fit_decreasing"
DEFAULT_OFFLOAD_POLICY = "none"

_PACKERS = {
    "first_fit_decreasing": "sort by length, place each sequence in the first row it fits",
    "modified_first_fit_decreasing": "first-fit decreasing that pairs long and short sequences first (default)",
    "first_fit_shuffle": "first fit over a shuffled order",
    "concatenative": "concatenate in order, cut at the token budget",
    "karmarkar_karp": "balance token counts across data-parallel ranks",
}

_OFFLOAD_POLICIES = {
    "none": "everything stays on the accelerator",
    "optimizer": "optimizer state leaves the accelerator while generating",
    "full": "parameters and optimizer state leave the accelerator while generating",
}


@hookimpl
def corerl_register_generation_backends(register: Callable[[GenerationBackend], None]) -> None:
    register(
        GenerationBackend(
            id="hf",
            priority=0,
            factory="corerl.generation.hf:HFGenerationBackend",
            description="transformers generate(): the reference backend, no extra engine",
        )
    )


@hookimpl
def corerl_register_sequence_packers(register: Callable[[SequencePacker], None]) -> None:
    for packer_id, description in _PACKERS.items():
        register(
            SequencePacker(
                id=packer_id,
                factory=pending_engine(f"sequence packer {packer_id!r}", "the sequence-packing issue"),
                description=description,
            )
        )


@hookimpl
def corerl_register_offload_policies(register: Callable[[OffloadPolicy], None]) -> None:
    for policy_id, description in _OFFLOAD_POLICIES.items():
        register(
            OffloadPolicy(
                id=policy_id,
                factory=pending_engine(f"offload policy {policy_id!r}", "the sequence-packing and offload issue"),
                description=description,
            )
        )


@hookimpl
def corerl_register_tasks(register: Callable[[Task], None]) -> None:
    register(Task(id="digit_echo", factory="corerl.tasks.digit_echo:DigitEcho",
                  description="echo the digit in the prompt (made in code; the demo's task)"))
    register(Task(id="dataset", factory="corerl.tasks.dataset:DatasetTask",
                  description="prompt/answer rows from data.train_files (JSONL or Parquet)"))


@hookimpl
def corerl_register_rewards(register: Callable[[Reward], None]) -> None:
    register(Reward(id="exact_answer", factory="corerl.tasks.rewards:exact_answer",
                    description="1 when the completion's answer equals the example's answer, else 0"))
