"""Vision-language policies: images from data rows and observations through hf generation, the
batch and the training forward, on tiny Qwen2.5-VL and Qwen3-VL models built in code."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from PIL import Image

from corerl.algorithms.batches import pairs_to_batch, samples_to_batch
from corerl.config import config_from_mapping
from corerl.environments.contract import EpisodeView, Turn
from corerl.environments.encoding import ObservationEncoder
from corerl.environments.pool import InProcessPool
from corerl.environments.rollout import MultiTurnRollout, SingleTurnRollout
from corerl.errors import ConfigError
from corerl.generation.contract import ImagePrompt, SamplingSettings
from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model
from corerl.models.vision import (
    IMAGE_PLACEHOLDER,
    ImageEncoder,
    freeze_vision_tower,
    vision_parameter_names,
)
from corerl.plugin_manager import PluginHost
from corerl.tasks import TaskContext
from corerl.training.image_rows import image_fields, image_inputs
from corerl.training.logprobs import model_logprobs
from corerl.training.microbatching import MicroBatcher

COLOURS = {"red": (230, 40, 40), "blue": (50, 80, 240), "green": (40, 200, 60)}
SAMPLING = SamplingSettings(temperature=1.0, max_new_tokens=4, seed=5)


def square(colour: str, side: int = 56) -> Image.Image:
    image = Image.new("RGB", (side, side), (0, 0, 0))
    image.paste(COLOURS[colour], (8, 8, side - 8, side - 8))
    return image


def _config(model: str, **policy):
    return config_from_mapping({"policy": {"model_name": model, "generation": {"backend": "hf"}, **policy}},
                               PluginHost(discover=False, env={}))


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vl(request, tmp_path_factory):
    """The hf backend on a tiny vision-language model of each family, and its image encoder."""
    from corerl.generation.hf import HFGenerationBackend

    shape = {**BUILTIN_MODELS["builtin:tiny-vl"], "family": request.param}
    model = str(build_tiny_model(tmp_path_factory.mktemp(request.param), seed=1, **shape))
    backend = HFGenerationBackend(_config(model))
    backend.load_hf(model)
    return backend, ImageEncoder(model, backend.tokenizer), model


def on_model(model, batch):
    """``batch`` on ``model``'s device (the hf backend's model is on the GPU where there is one)."""
    device = next(model.parameters()).device
    return {key: value.to(device) for key, value in batch.items()}


def prompt(backend, encoder, colours, text="what colour is the square ?"):
    images = encoder.encode([square(c) for c in colours], "test")
    ids = backend.tokenizer.encode(" ".join([IMAGE_PLACEHOLDER] * len(colours) + [text]), add_special_tokens=False)
    return ImagePrompt([backend.tokenizer.bos_token_id, *encoder.expand(ids, images, "test")], images)


def test_each_row_keeps_its_own_images_through_the_batch_fields_and_micro_batches():
    encoder_grid = torch.tensor([[1, 4, 4]])
    one = type("I", (), {"pixel_values": torch.randn(16, 6), "grid_thw": encoder_grid})()
    two = type("I", (), {"pixel_values": torch.randn(36, 6), "grid_thw": torch.tensor([[1, 4, 4], [1, 2, 10]])})()
    fields = image_fields([one, None, two])
    assert fields["pixel_values"].shape == (3, 36, 6) and fields["image_grid_thw"].shape == (3, 2, 3)
    batch = {"input_ids": torch.tensor([[6, 6, 1], [1, 2, 3], [6, 6, 6]]), **fields}
    joined = image_inputs(batch, image_token_id=6)
    assert torch.equal(joined["pixel_values"], torch.cat([one.pixel_values, two.pixel_values]))
    assert joined["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4], [1, 2, 10]]
    assert joined["mm_token_type_ids"].tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 1]]
    # rows 2 and 0 of a micro-batch, chosen by the dynamic layout: each keeps its own images
    full = {**batch, "attention_mask": torch.ones(3, 3, dtype=torch.long), "loss_mask": torch.ones(3, 3)}
    config = _config("builtin:tiny-qwen2", dynamic_batching={"enabled": True, "train_mb_tokens": 6})
    plan = MicroBatcher.from_config(config).plan(full, ranks=1)
    assert len(plan.per_rank[0]) > 1
    grids = []
    for mb in plan.per_rank[0]:
        inputs = image_inputs(mb, 6)
        if "image_grid_thw" in inputs:
            assert inputs["pixel_values"].shape[0] == int(inputs["image_grid_thw"].prod(-1).sum())
            grids += inputs["image_grid_thw"].tolist()
    assert sorted(grids) == [[1, 2, 10], [1, 4, 4], [1, 4, 4]]


def test_generation_reads_the_images_and_training_logprobs_equal_the_sampled_ones(vl):
    backend, encoder, _ = vl
    prompts = [prompt(backend, encoder, ["red"]), prompt(backend, encoder, ["blue", "green"])]
    rollout = SingleTurnRollout(backend, lambda sample, row: 0.0).run(prompts, [None, None], SAMPLING, 3, 64)
    assert all(s.images is p.images for group, p in zip(rollout.groups, prompts, strict=True) for s in group)
    vision = set(encoder.tokens_per_image(prompts[1].images)) and {encoder.image_token_id}
    assert not any(vision & set(s.completion_ids) for group in rollout.groups for s in group)
    batch = samples_to_batch(rollout.groups, torch.zeros(6))
    with torch.no_grad():
        trained = model_logprobs(backend.model, on_model(backend.model, batch)).cpu()
    mask = batch["loss_mask"].bool()
    assert (trained[mask] - batch["gen_logprobs"][mask]).abs().max() < 1e-4
    # the images matter: the same text before another image gives other logprobs
    other = prompt(backend, encoder, ["green"])
    swapped = dict(batch, **image_fields([other.images] * 3 + [prompts[1].images] * 3))
    with torch.no_grad():
        moved = model_logprobs(backend.model, on_model(backend.model, swapped)).cpu()
        assert (moved[:3][mask[:3]] - trained[:3][mask[:3]]).abs().max() > 1e-3


def test_a_prompt_samples_the_same_from_its_images_whatever_shares_its_call(vl):
    backend, encoder, _ = vl
    red, blue = prompt(backend, encoder, ["red"]), prompt(backend, encoder, ["blue", "green"])
    seeded = SamplingSettings(temperature=1.0, max_new_tokens=4, seed=1, request_seeds=(11,))
    alone = backend.generate([red], seeded, n=2)
    shared = backend.generate([blue, red], SamplingSettings(temperature=1.0, max_new_tokens=4, seed=1,
                                                             request_seeds=(12, 11)), n=2)
    assert [s.completion_ids for s in alone[0]] == [s.completion_ids for s in shared[1]]


class ShowsAnImage:
    """Turn 1: answers with a message holding an image and a question; turn 2: done."""

    def step(self, episode: EpisodeView) -> Turn:
        if episode.turn >= 2:
            return Turn(reward=1.0, done=True)
        buffer = io.BytesIO()
        square("green").save(buffer, format="PNG")
        content = [{"type": "image", "image": buffer.getvalue()}, {"type": "text", "text": "and this one ?"}]
        return Turn(observation=[{"role": "user", "content": content}])


def test_an_episode_carries_every_image_of_its_history_into_generation_and_training(vl):
    backend, encoder, _ = vl
    tokenizer = backend.tokenizer
    rollout = MultiTurnRollout(backend, InProcessPool(ShowsAnImage(), 30.0), ObservationEncoder(tokenizer, encoder),
                               tokenizer, "shows_an_image")
    first = prompt(backend, encoder, ["red"])
    result = rollout.run([first], [{"_corerl_origin": "rows.jsonl line 1"}], SAMPLING, 2, 200)
    for sample in result.groups[0]:
        assert sample.images is not None and sample.images.grid_thw.shape[0] == 2  # the prompt's and the observation's
        tokens = list(sample.prompt_ids) + list(sample.completion_ids)
        assert tokens.count(encoder.image_token_id) == sum(encoder.tokens_per_image(sample.images))
    batch = samples_to_batch(result.groups, torch.zeros(2))
    with torch.no_grad():
        trained = model_logprobs(backend.model, on_model(backend.model, batch)).cpu()
    mask = batch["loss_mask"].bool()
    assert (trained[mask] - batch["gen_logprobs"][mask]).abs().max() < 1e-4
    # a text-only policy's encoder refuses an observation with an image (the episode's env_malformed)
    with pytest.raises(ValueError, match="text-only"):
        ObservationEncoder(tokenizer).encode_with_images(ShowsAnImage().step(
            EpisodeView(row={}, turn=1, responses=("x",))).observation, True, "row 1")


def test_the_dataset_task_reads_paths_base64_bytes_and_chat_image_parts(vl, tmp_path):
    from corerl.config.schema import DataConfig
    from corerl.tasks.dataset import DatasetTask

    backend, encoder, _ = vl
    square("red").save(tmp_path / "red.png")
    buffer = io.BytesIO()
    square("blue").save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    rows = [{"prompt": "what colour is the square ?", "answer": "red", "images": "red.png"},
            {"prompt": [{"role": "user", "content": [{"type": "image", "image": encoded},
                                                     {"type": "text", "text": "what colour ?"}]}], "answer": "blue"},
            {"prompt": "<image> <image> ?", "answer": "red", "images": ["red.png", f"data:image/png;base64,{encoded}"]},
            {"prompt": "what colour ?", "answer": "none"}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    data = DataConfig(task="dataset", train_files=str(tmp_path / "train.jsonl"), held_out_size=1)
    task = DatasetTask(TaskContext(backend.tokenizer, 0, data, images=encoder, max_prompt_tokens=200))
    prompts, examples = task.sample(3)
    held, held_examples = task.held_out()
    by_answer = {json.dumps(e["prompt"]): p for p, e in zip([*prompts, *held], [*examples, *held_examples], strict=True)}
    assert len(by_answer) == 4 and all("_corerl_images" not in e for e in examples)
    shown = [by_answer[json.dumps(row["prompt"])] for row in rows]
    assert [p.images.grid_thw.shape[0] for p in shown[:3]] == [1, 1, 2] and not hasattr(shown[3], "images")
    assert torch.equal(shown[0].images.pixel_values, encoder.encode([square("red")], "x").pixel_values)
    assert all(p.count(encoder.image_token_id) == sum(encoder.tokens_per_image(p.images)) for p in shown[:3])
    demonstration = task.demonstrations(1)[0]
    assert pairs_to_batch([demonstration])["pixel_values"].shape[0] == 1
    # Parquet: the image as bytes
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["what colour ?"] * 2, "answer": ["blue"] * 2,
                             "picture": [buffer.getvalue()] * 2}), tmp_path / "train.parquet")
    parquet = DataConfig(task="dataset", train_files=str(tmp_path / "train.parquet"), image_key="picture",
                         held_out_size=1)
    (first,), _ = DatasetTask(TaskContext(backend.tokenizer, 0, parquet, images=encoder)).sample(1)
    assert torch.equal(first.images.pixel_values, shown[1].images.pixel_values)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "x", "answer": "y", "images": "missing.png"}, "missing.png' does not exist"),
    ({"prompt": f"{IMAGE_PLACEHOLDER} {IMAGE_PLACEHOLDER} ?", "answer": "y", "images": "red.png"},
     "2 image placeholders for 1 images"),
    ({"prompt": f"{IMAGE_PLACEHOLDER} ?", "answer": "y"}, "1 image placeholders for 0 images"),
    ({"prompt": "x", "answer": "y", "images": "bad.png"}, "not a readable image"),
])
def test_bad_image_rows_are_refused_in_one_line_naming_the_row(vl, tmp_path, row, message):
    from corerl.config.schema import DataConfig
    from corerl.tasks.dataset import DatasetTask

    backend, encoder, _ = vl
    square("red").save(tmp_path / "red.png")
    (tmp_path / "bad.png").write_text("not an image")
    (tmp_path / "train.jsonl").write_text(json.dumps(row))
    data = DataConfig(task="dataset", train_files=str(tmp_path / "train.jsonl"))
    with pytest.raises(ConfigError, match=message) as refused:
        DatasetTask(TaskContext(backend.tokenizer, 0, data, images=encoder))
    assert "train.jsonl line 1" in str(refused.value) and "\n" not in str(refused.value)


def test_images_for_a_text_only_policy_are_refused(tmp_path):
    from corerl.config.schema import DataConfig
    from corerl.models.tiny import build_tokenizer
    from corerl.tasks.dataset import DatasetTask

    square("red").save(tmp_path / "red.png")
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "x", "answer": "y", "images": "red.png"}))
    data = DataConfig(task="dataset", train_files=str(tmp_path / "train.jsonl"))
    with pytest.raises(ConfigError, match="text-only model") as refused:
        DatasetTask(TaskContext(build_tokenizer(), 0, data))
    assert refused.value.key == "policy.model_name"


def test_the_vision_tower_is_frozen_for_rl_trained_for_sft_and_left_out_of_the_lora_adapter(vl):
    from peft import get_peft_model

    from corerl.config.schema import LoraConfig as LoraSettings
    from corerl.lora.adapter import peft_config
    from corerl.models.vision import auto_model_class, with_vision_default

    _, _, path = vl
    for samples, chosen, frozen in ((True, None, True), (False, None, False), (False, True, True), (True, False, False)):
        model = auto_model_class(path).from_pretrained(path)
        config = config_from_mapping({"policy": {"model_name": path, "freeze_vision_tower": chosen}},
                                     PluginHost(discover=False, env={}))
        freeze_vision_tower(model, with_vision_default(config, samples))
        vision = set(vision_parameter_names(model))
        assert vision and all(p.requires_grad != frozen for n, p in model.named_parameters() if n in vision)
        assert all(p.requires_grad for n, p in model.named_parameters() if n not in vision)
    wrapped = get_peft_model(auto_model_class(path).from_pretrained(path), peft_config(LoraSettings(), path))
    adapted = [n for n, _ in wrapped.named_parameters() if "lora_" in n]
    assert adapted and not [n for n in adapted if ".visual." in n]


def test_a_training_backend_of_an_older_contract_is_refused_for_a_vision_language_policy(tmp_path):
    """Its plugin states 2.12: batches of images would reach a forward that may not pass them on."""
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.errors import CorerlError
    from corerl.recipes import DEMO_RECIPE

    host = PluginHost(env={})
    overrides = ["policy.model_name=builtin:tiny-vl", "data.task=shape_colour", "policy.generation.backend=hf"]
    assert select(load_config(str(DEMO_RECIPE), overrides, host), host).training_backend.id == "dtensor"
    host.plugins["dtensor"].contract = "2.12"
    with pytest.raises(CorerlError, match="states contract 2.12, older than 2.13") as refused:
        select(load_config(str(DEMO_RECIPE), overrides, host), host)
    assert "\n" not in str(refused.value)
    text_only = select(load_config(str(DEMO_RECIPE), ["policy.generation.backend=hf"], host), host)
    assert text_only.training_backend.id == "dtensor"  # a text-only model: nothing changes for it


def test_the_vl_demo_recipe_runs_sft_then_grpo_on_images_in_process(tmp_path):
    """examples/configs/grpo_vl_demo.yaml cut to 2 + 2 steps (its whole run, 0.000 -> 0.312 -> 0.906
    held-out reward in 88 s on 2 CPU cores, is in docs/vlm.md): dtensor's model sampled by hf."""
    import corerl
    from tests.conftest import EXAMPLES

    result = corerl.GRPOTrainer.from_recipe(
        str(EXAMPLES / "grpo_vl_demo.yaml"), "sft.max_steps=2", "algorithm.max_steps=2", "algorithm.batch_size=4",
        "checkpointing.enabled=false", f"run.output_dir={tmp_path}", "run.name=vl").train()
    rows = [json.loads(line) for line in (tmp_path / "vl" / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r.get("phase") == "grpo"]
    assert [r["phase"] for r in rows if "phase" in r] == ["sft", "sft", "grpo", "grpo"]
    assert all(r["logprob_mismatch/max"] < 1e-4 for r in grpo)  # training read the images generation saw
    assert result.summary["algorithm"] == "grpo"


def test_a_checkpoint_without_its_image_processor_is_refused_in_one_line(vl, tmp_path):
    import shutil

    backend, _, path = vl
    shutil.copy(f"{path}/config.json", tmp_path / "config.json")
    with pytest.raises(ConfigError, match="the image processor of .* cannot be built") as refused:
        ImageEncoder(tmp_path, backend.tokenizer)
    assert refused.value.key == "policy.model_name" and "\n" not in str(refused.value)
