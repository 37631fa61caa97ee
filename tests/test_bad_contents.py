"""Bad contents of a recipe's inputs (issue 72): data rows that are not JSON objects or lack a
column, a vision-language recipe's images (missing, not an image, corrupt, past
``data.max_image_pixels``, a decompression bomb) and placeholders, and a teacher's or reward
model's vocabulary against the policy's. ``corerl validate`` and ``corerl run`` print the same
one line for each (both call :func:`corerl.run.inputs.check_run_inputs`), exit 2, and the run
writes nothing first: its directory does not exist afterwards, or is as it was (resumed). Run in
this process (``corerl.cli.main``, fast tier)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from corerl import cli
from tests.refusals import refused_in_one_line

QUESTION = "what colour is the square ?"
VL = ["policy.model_name=builtin:tiny-vl", "data.held_out_size=2"]
DISTILL = ["algorithm.name=distillation", "policy.model_name=builtin:tiny-qwen2-small", "data.task=digit_echo"]
REWARD = ["data.task=digit_echo", "reward_model.model_name=builtin:tiny-vl"]


def _png(path: Path, side: int) -> Path:
    from PIL import Image

    Image.new("RGB", (side, side), (230, 40, 40)).save(path)
    return path


def _bomb(path: Path, side: int = 20000) -> Path:
    """A PNG whose header says ``side`` x ``side`` pixels (PIL refuses past 179 million before it
    decodes anything), with no pixel data: a few dozen bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit greyscale
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    return path


def _rows(count: int = 8, **fields: object) -> list[dict[str, object]]:
    return [{"prompt": QUESTION, "answer": "red", **fields} for _ in range(count)]


def _jsonl(path: Path, rows: list[object], broken: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    for number, text in (broken or {}).items():
        lines[number - 1] = text
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _with_row(folder: Path, number: int, row: dict[str, object], **fields: object) -> Path:
    rows = _rows(**fields)
    rows[number - 1] = row
    return _jsonl(folder / "train.jsonl", rows)


def _image_row(folder: Path, image: str) -> list[str]:
    _png(folder / "ok.png", 56)
    train = _with_row(folder, 3, {"prompt": QUESTION, "answer": "red", "images": image}, images="ok.png")
    return [*VL, f"data.train_files={train}"]


def _not_an_image(folder: Path) -> list[str]:
    (folder / "notes.png").write_text("not a picture")
    return _image_row(folder, "notes.png")


def _truncated(folder: Path) -> list[str]:
    whole = _png(folder / "whole.png", 56).read_bytes()
    (folder / "cut.png").write_bytes(whole[: len(whole) // 2])
    return _image_row(folder, "cut.png")


def _too_large(folder: Path) -> list[str]:
    _png(folder / "large.png", 300)  # 90,000 pixels; the tiny processor's max_pixels is 112 x 112 (12,544)
    return _image_row(folder, "large.png")


def _bomb_row(folder: Path) -> list[str]:
    _bomb(folder / "bomb.png")
    return _image_row(folder, "bomb.png")


def _placeholders(folder: Path) -> list[str]:
    _png(folder / "ok.png", 56)
    train = _with_row(folder, 5, {"prompt": "<image> left , <image> right", "answer": "red", "images": "ok.png"},
                      images="ok.png")
    return [*VL, f"data.train_files={train}"]


def _held_out_placeholders(folder: Path) -> list[str]:
    _png(folder / "ok.png", 56)
    train = _jsonl(folder / "train.jsonl", _rows(images="ok.png"))
    held = _jsonl(folder / "held.jsonl", [{"prompt": f"<image> {QUESTION}", "answer": "red"}])
    return ["policy.model_name=builtin:tiny-vl", f"data.train_files={train}", f"data.held_out_files={held}"]


def _text_policy_images(folder: Path) -> list[str]:
    _png(folder / "ok.png", 56)
    return [f"data.train_files={_jsonl(folder / 'train.jsonl', _rows(images='ok.png'))}", "data.held_out_size=2"]


def _teacher_folder(folder: Path) -> list[str]:
    """A teacher checkpoint folder whose tokenizer has 96 of the student's 128 words (its weights
    are not read before the refusal)."""
    from corerl.models.tiny import build_tokenizer, tiny_hf_config

    teacher = folder / "teacher"
    build_tokenizer(96).save_pretrained(teacher)
    (teacher / "config.json").write_text(json.dumps(tiny_hf_config(vocab_size=96)))
    (teacher / "model.safetensors").write_bytes(b"")
    return [*DISTILL, f"algorithm.distillation.teacher_model={teacher}"]


def _data(rows: list[object], broken: dict[int, str] | None = None, *extra: str):
    def make(folder: Path) -> list[str]:
        return [f"data.train_files={_jsonl(folder / 'train.jsonl', rows, broken)}", "data.held_out_size=2", *extra]

    return make


# (id, what makes the overrides from a fresh folder, what the one line both commands print says)
CASES = [
    ("not-json", _data(_rows(), {4: '{"prompt": "1 2", '}),
     "data.train_files: train.jsonl line 4 is not valid JSON"),
    ("not-an-object", _data(_rows(), {6: "[1, 2]"}),
     "data.train_files: train.jsonl line 6 holds a list, not a JSON object"),
    ("wrong-field", _data(_rows(), None, "data.prompt_key=question"),
     "data.prompt_key: column 'question' (data.prompt_key) is not in "),
    ("row-without-answer", _data([*_rows(3), {"prompt": QUESTION}, *_rows(4)]),
     "data.train_files: train.jsonl line 4 has no 'answer' (data.answer_key)"),
    ("pairs-without-rejected", lambda folder: ["algorithm.name=dpo", "data.task=preferences",
                                               *_data([{"prompt": "1 2", "chosen": "2"}] * 8)(folder)],
     "data.rejected_key: column 'rejected' (data.rejected_key) is not in "),
    ("missing-image", lambda folder: _image_row(folder, "gone.png"),
     "data.image_key: train.jsonl line 3, image 1: image file "),
    ("not-an-image", _not_an_image, "data.image_key: train.jsonl line 3, image 1: image file "),
    ("truncated-image", _truncated, "data.image_key: train.jsonl line 3, image 1: image file "),
    ("image-past-the-default-limit", _too_large,
     "data.max_image_pixels: train.jsonl line 3, image 1: image file "),
    ("image-past-the-set-limit", lambda folder: [*_image_row(folder, "ok.png"), "data.max_image_pixels=1000"],
     "data.max_image_pixels: train.jsonl line 1, image 1: image file "),
    ("decompression-bomb", _bomb_row, "data.max_image_pixels: train.jsonl line 3, image 1: image file "),
    ("placeholders", _placeholders,
     "data.train_files: train.jsonl line 5: the prompt holds 2 image placeholders for 1 images"),
    ("held-out-placeholders", _held_out_placeholders,
     "data.held_out_files: held.jsonl line 1: the prompt holds 1 image placeholders for 0 images"),
    ("images-for-a-text-policy", _text_policy_images,
     "policy.model_name: train.jsonl line 1: the row has 1 image(s) and the policy is a text-only model"),
    ("teacher-vocabulary", lambda folder: [*DISTILL, "algorithm.distillation.teacher_model=builtin:tiny-vl"],
     "algorithm.distillation.teacher_model: the teacher's tokenizer differs from the policy's: 128 vs 128 tokens"),
    ("teacher-folder-vocabulary", _teacher_folder,
     "algorithm.distillation.teacher_model: the teacher's tokenizer differs from the policy's: 96 vs 128 tokens"),
    ("reward-model-vocabulary", lambda folder: [*REWARD, "reward_model.kind=bradley_terry"],
     "reward_model.model_name: the reward model's tokenizer differs from the policy's"),
    ("judge-vocabulary", lambda folder: [*REWARD, "reward_model.kind=llm_judge"],
     "reward_model.model_name: the judge's tokenizer differs from the policy's"),
]
# what else the line says, by case
ALSO = {
    "wrong-field": ["columns: answer, prompt", "set data.prompt_key to one of: answer, prompt"],
    "missing-image": ["gone.png' does not exist"],
    "not-an-image": ["notes.png is not a readable image (cannot identify image file"],
    "truncated-image": ["cut.png is not a readable image ("],
    "image-past-the-default-limit": ["large.png is 300 x 300 pixels (90000), more than the 50176 data.max_image_pixels "
                                     "allows", "raise data.max_image_pixels"],
    "image-past-the-set-limit": ["ok.png is 56 x 56 pixels (3136), more than the 1000 data.max_image_pixels allows"],
    "decompression-bomb": ["bomb.png is refused as a decompression bomb (Image size (400000000 pixels)"],
}


@pytest.fixture
def corerl(capfd, monkeypatch, tmp_path):
    """``corerl <command> <overrides>`` in this process: its exit status and stderr, for
    :func:`tests.refusals.refused_in_one_line`, after checking stdout holds no traceback."""
    import corerl.reporting.quiet as quiet

    monkeypatch.chdir(tmp_path)

    def command(*argv: str) -> tuple[int, str]:
        monkeypatch.setattr(quiet, "_last_log", None)  # an error line names the log of a run this process started
        code = cli.main(list(argv))
        captured = capfd.readouterr()
        assert "Traceback" not in captured.out, captured
        return code, captured.err

    return command


BASE = ["policy.generation.backend=hf", "sft.enabled=false", "data.task=dataset", "algorithm.max_steps=1"]


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize(("make", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_validate_and_run_print_the_same_line_and_run_writes_nothing(corerl, tmp_path, request, make, says):
    case = request.node.callspec.id
    data = tmp_path / "data"
    data.mkdir()
    overrides = [*BASE, *make(data)]
    runs = tmp_path / "runs"
    key, _, text = says.partition(": ")
    validated = refused_in_one_line(corerl("validate", *overrides, f"run.output_dir={runs}", "run.name=bad"), text,
                                    key=key)
    for also in ALSO.get(case, []):
        assert also in validated, validated
    assert "_corerl_" not in validated  # no internal column offered
    assert refused_in_one_line(corerl("run", *overrides, f"run.output_dir={runs}", "run.name=bad")) == validated
    assert not runs.exists()  # no base_model/, recipe.yaml or run.log, whose empty log the line named


def test_a_resumed_run_directory_is_left_as_it_was(corerl, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    overrides = [*BASE, *_placeholders(data)]
    run_dir = tmp_path / "runs" / "again"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')  # a run that stopped before its first checkpoint
    (run_dir / "recipe.yaml").write_text("policy: {}\n")
    before = _tree(run_dir)
    refused_in_one_line(corerl("run", *overrides, f"run.output_dir={tmp_path / 'runs'}", "run.name=again"),
                        "image placeholders")
    assert _tree(run_dir) == before  # not started over: metrics.jsonl kept


def test_good_images_and_vocabularies_pass(corerl, tmp_path, capfd):
    data = tmp_path / "data"
    data.mkdir()
    _png(data / "a.png", 56)
    _png(data / "b.png", 112)  # the processor's max_pixels itself
    rows = [*_rows(4, images="a.png"), *_rows(2, images=["a.png", "b.png"]),
            {"prompt": [{"role": "user", "content": [{"type": "image", "image": "b.png"},
                                                     {"type": "text", "text": QUESTION}]}], "answer": "red"},
            {"prompt": f"<image> {QUESTION}", "answer": "red", "images": "a.png"}]
    train = _jsonl(data / "train.jsonl", rows)
    for overrides in ([*BASE, *VL, f"data.train_files={train}"],
                      [*BASE, *DISTILL, "algorithm.distillation.teacher_model=builtin:tiny-qwen2"]):
        assert cli.main(["validate", *overrides, f"run.output_dir={tmp_path / 'runs'}"]) == 0, capfd.readouterr().err
    assert capfd.readouterr().err == ""
