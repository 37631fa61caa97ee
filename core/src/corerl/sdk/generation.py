"""What a generation backend (``corerl_register_generation_backends``) needs beyond
:mod:`corerl.sdk.registering`: the generation contract, images, the sampling helpers, the weights
a refit brings (shared, under checkpoint names, a LoRA adapter) and where its workers run."""

from __future__ import annotations

from corerl.distributed.devices import local_gpu_index, runs_here_without_gpu
from corerl.distributed.placement import GPU_SHARE, dedicated_generation_layout, training_layout
from corerl.distributed.worker_group import LocalWorkerGroup, RayWorkerGroup, free_port
from corerl.generation.bad_words import banned_sequences
from corerl.generation.contract import (
    GenerationEngine,
    ImagePrompt,
    Images,
    Sample,
    SamplingSettings,
    images_of,
)
from corerl.generation.routes import FIELD as ROUTED_EXPERTS
from corerl.generation.routes import wants_routes
from corerl.generation.sampling import (
    choose_tokens,
    choose_tokens_per_row,
    cut_at_stop_strings,
    row_generators,
    row_seeds,
)
from corerl.generation.shared_weights import SharedWeightWriter, read_shared
from corerl.lora.adapter import is_adapter_name, lora_enabled, write_adapter
from corerl.lora.weights import AdapterWeights
from corerl.models.facts import check_tensor_parallel, model_shape
from corerl.models.tokenizer import load_tokenizer_folder
from corerl.models.vision import is_vision_language, read_hf_config, vision_token_ids
from corerl.planning.memory import GenerationMemory, PlanRequest
from corerl.training.weights import CheckpointNaming

__all__ = [
    # the generation contract
    "GenerationEngine", "Sample", "SamplingSettings",
    # images: vision-language models
    "Images", "ImagePrompt", "images_of", "is_vision_language", "read_hf_config", "vision_token_ids",
    # sampling a step's tokens, stop strings, banned words
    "choose_tokens", "choose_tokens_per_row", "row_generators", "row_seeds", "cut_at_stop_strings",
    "banned_sequences",
    # router replay r3: whether to report the experts chosen (Sample.routed_experts), the batch field
    "wants_routes", "ROUTED_EXPERTS",
    # the refit's weights: shared through a file, under checkpoint names, a LoRA adapter
    "SharedWeightWriter", "read_shared", "CheckpointNaming",
    "lora_enabled", "is_adapter_name", "AdapterWeights", "write_adapter",
    # the model: shape, tensor-parallel refusal, tokenizer
    "model_shape", "check_tensor_parallel", "load_tokenizer_folder",
    # where its workers run
    "LocalWorkerGroup", "RayWorkerGroup", "training_layout", "dedicated_generation_layout", "GPU_SHARE",
    "runs_here_without_gpu", "local_gpu_index", "free_port",
    # its memory model for `corerl plan` (what the engine holds beside a training layout)
    "GenerationMemory", "PlanRequest",
]
