"""Bad inputs a user can give: each exits 2 with one line naming the key path or the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import clean_env, markers_written, run_corerl
from tests.refusals import refused_in_one_line

GOOD = "cluster:\n  gpus_per_node: 2\npolicy:\n  model_name: some/model\n"

# (id, recipe text or None for GOOD, extra args, text the one error line must contain)
CASES = [
    ("unknown-key", None, ["policy.max_seq_lenght=5"], "policy.max_seq_lenght: unknown key; did you mean policy.max_seq_length?"),
    ("misspelled-section-in-file", "polcy:\n  model_name: m\n", [], "polcy: unknown key; did you mean policy?"),
    ("misspelled-plugin-section", None, ["policy.megatorn_cfg.enabled=true"], "did you mean policy.megatron_cfg?"),
    ("wrong-type-int", None, ["policy.max_seq_length=abc"], "policy.max_seq_length: expected an integer, got str 'abc'"),
    ("wrong-type-bool", None, ["policy.dtensor_cfg.enabled=1"], "policy.dtensor_cfg.enabled: expected true or false"),
    ("wrong-type-section", None, ["policy.generation=3"], "policy.generation: expected a section (mapping), got int 3"),
    ("wrong-type-plugin-section", None, ["policy.megatron_cfg=on"], "policy.megatron_cfg: expected a section"),
    ("zero-size", None, ["cluster.gpus_per_node=0"], "cluster.gpus_per_node: must be at least 1, got 0"),
    ("negative-size", None, ["algorithm.batch_size=-4"], "algorithm.batch_size: must be at least 1, got -4"),
    ("negative-temperature", None, ["policy.generation.temperature=-1"], "policy.generation.temperature: must be at least 0.0"),
    ("zero-memory-fraction", None, ["policy.generation.vllm_cfg.gpu_memory_utilization=0"], "gpu_memory_utilization: must be greater than 0.0"),
    ("bad-choice", None, ["policy.precision=fp8"], "policy.precision: expected one of 'float32', 'bfloat16', 'float16'"),
    ("yaml-syntax", "policy:\n  model_name: [unclosed\n", [], "YAML syntax error at "),
    ("top-level-list", "- a\n- b\n", [], "must be a mapping of sections at the top level"),
    ("missing-required", "policy:\n  precision: float32\n", [], "policy.model_name: missing required key"),
    ("override-missing-key", None, ["policy.nonexistent=1"], "policy.nonexistent: unknown key"),
    ("override-into-scalar", None, ["policy.model_name.revision=2"], "policy.model_name holds a str, not a section"),
    ("malformed-override", None, ["policy.precision"], "malformed override 'policy.precision': expected KEY=VALUE"),
    ("malformed-override-key", None, ["policy..precision=x"], "is not a dotted key path"),
    ("malformed-override-value", None, ["policy.model_name=[a"], "the value is not valid YAML"),
    ("unknown-training-backend", None, ["policy.training_backend=tpu"], "policy.training_backend: training backend 'tpu' is not available"),
    ("unknown-generation-backend", None, ["policy.generation.backend=trtllm"], "policy.generation.backend: generation backend 'trtllm' is not available"),
    ("unknown-packer", None, ["policy.sequence_packing.enabled=true", "policy.sequence_packing.algorithm=best"], "policy.sequence_packing.algorithm: sequence packer 'best' is not available"),
    ("tp-does-not-divide-world", None, ["policy.dtensor_cfg.tensor_parallel_size=3"], "policy.dtensor_cfg.tensor_parallel_size: tensor_parallel_size x context_parallel_size (3) must divide"),
    ("megatron-parallel-too-large", None, ["policy.megatron_cfg.pipeline_model_parallel_size=4"], "policy.megatron_cfg.tensor_model_parallel_size: tensor_model_parallel_size x pipeline_model_parallel_size x context_parallel_size (4) must divide"),
    ("nvme-without-path", None, ["policy.deepspeed_cfg.offload_optimizer=nvme"], "policy.deepspeed_cfg.nvme_path: offload to nvme needs nvme_path"),
    ("dedicated-without-resources", None, ["policy.generation.colocated.enabled=false"], "policy.generation.colocated.resources.gpus_per_node: dedicated generation"),
    ("both-alias-spellings", GOOD + "  dtensor_cfg: {}\n  dtensor_config: {}\n", [], "policy.dtensor_cfg: both policy.dtensor_cfg and its alias"),
    ("defaults-wrong-type", "defaults: 3\n" + GOOD, [], "defaults: expected a recipe path or a list of recipe paths"),
    ("unknown-cli-flag", None, ["--jsn"], "unrecognized arguments: --jsn"),
]


@pytest.mark.parametrize(("text", "extra", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, text, extra, expected):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(GOOD if text is None else text, encoding="utf-8")
    result = run_corerl("validate", str(recipe), *extra)
    refused_in_one_line(result, expected)
    assert result.out == "", result


def test_missing_file_names_the_file(tmp_path):
    line = refused_in_one_line(run_corerl("validate", str(tmp_path / "nope.yaml")))
    assert line == f"corerl: error: recipe file not found: {tmp_path / 'nope.yaml'}; check the path"


def test_missing_defaults_target_names_both_files(tmp_path):
    recipe = tmp_path / "child.yaml"
    recipe.write_text("defaults: parent.yaml\n" + GOOD, encoding="utf-8")
    refused_in_one_line(run_corerl("validate", str(recipe)),
                        f"recipe file not found: {tmp_path / 'parent.yaml'} (named by defaults: in {recipe})")


def test_inheritance_cycle_shows_the_chain(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: b.yaml\n" + GOOD, encoding="utf-8")
    (tmp_path / "b.yaml").write_text("defaults: a.yaml\n", encoding="utf-8")
    refused_in_one_line(run_corerl("validate", str(tmp_path / "a.yaml")),
                        "defaults: inheritance cycle through defaults: a.yaml -> b.yaml -> a.yaml", key="defaults")


def test_yaml_syntax_error_gives_file_line_and_column(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("policy:\n  model_name: m\n  precision: [bf16\n", encoding="utf-8")
    result = run_corerl("validate", str(recipe))
    assert f"YAML syntax error at {recipe}:4:1" in result.err


def test_several_errors_are_listed_one_line_each(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(GOOD, encoding="utf-8")
    result = run_corerl("validate", str(recipe), "cluster.num_nodes=0", "policy.precision=fp8", "algorithm.max_step=3")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("corerl: error: ") for line in lines)


def test_json_mode_reports_errors_with_key_and_message(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(GOOD, encoding="utf-8")
    result = run_corerl("validate", str(recipe), "policy.dtensor_cfg.tensor_parallel_size=3", "--json")
    assert result.code == 2
    report = result.json()
    assert report["valid"] is False and report["training_backend"] is None
    (error,) = report["errors"]
    assert error["key"] == "policy.dtensor_cfg.tensor_parallel_size"
    assert "must divide the world size" in error["message"]


def test_no_command_is_a_usage_error():
    result = run_corerl()
    assert result.code == 2 and "Traceback" not in result.err


def test_a_gpu_asked_of_a_machine_without_one_stops_the_run_at_once_in_one_line(tmp_path):
    # dedicated generation on a GPU of its own: the Ray cluster the run joins (this test worker's
    # shared head) has none. "At once" is the fast path, not a clock: refused by the selection's
    # cluster check before the runner starts (its first progress marker, run:start, comes before
    # any engine or model is built), in that check's own line (a run that went on to reserve the
    # pool would end, after the 1 s start timeout given here, with Ray's "could not reserve" line)
    markers = tmp_path / "markers.txt"
    output = tmp_path / "out"
    env = clean_env({"CORERL_PROGRESS_MARKERS": str(markers), "CORERL_WORKER_START_TIMEOUT": "1"})
    result = run_corerl("run", "policy.generation.colocated.enabled=false", "policy.generation.backend=vllm",
                        "policy.generation.colocated.resources.gpus_per_node=1", f"run.output_dir={output}", env=env)
    line = refused_in_one_line(result, key="policy.generation.colocated.resources.gpus_per_node")
    assert "run:start" not in markers_written(markers), markers_written(markers)  # refused before the run began
    assert not output.exists() or list(output.iterdir()) == []  # no run directory for a run that cannot start
    assert line.startswith("corerl: error: policy.generation.colocated.resources.gpus_per_node: the generation "
                           "engines ask for a GPU each but the Ray cluster has none"), line
