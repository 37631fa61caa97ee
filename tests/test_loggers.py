"""Experiment loggers (``logger.<id>``): TensorBoard, MLflow and W&B, each for real without a
network: MLflow into a SQLite store read back with ``mlflow.search_runs``, W&B in offline mode
with its run file read back record by record."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from corerl.config import config_from_mapping
from corerl.config.selection import select
from corerl.errors import RunError
from corerl.plugin_manager import PluginHost
from corerl.reporting.console import make_console
from corerl.reporting.loggers.start import start_loggers
from corerl.run.loop import execute

STEPS = 3


def _recipe(tmp_path: Path, **logger: Any) -> dict:
    return {"cluster": {"gpus_per_node": 1},
            "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 4},
                       "max_seq_length": 64},
            "algorithm": {"name": "grpo", "batch_size": 4, "num_generations_per_prompt": 2, "max_steps": STEPS},
            "data": {"task": "digit_echo"},
            "run": {"output_dir": str(tmp_path), "name": "logged"},
            "logger": logger}


def _run(tmp_path: Path, **logger: Any) -> Path:
    host = PluginHost(env={})
    config = config_from_mapping(_recipe(tmp_path, **logger), host)
    result = execute(config, select(config, host), host, make_console())
    return result.run_dir


def test_mlflow_records_the_recipe_and_every_step_and_tensorboard_still_writes(tmp_path):
    import mlflow
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = _run(tmp_path, mlflow={"enabled": True, "experiment_name": "digits", "run_name": "first"})
    store = f"sqlite:///{run_dir / 'mlflow.db'}"
    mlflow.set_tracking_uri(store)
    (run,) = mlflow.search_runs(experiment_names=["digits"], output_format="list")
    assert run.info.run_name == "first" and run.info.status == "FINISHED"
    assert run.data.params["algorithm.max_steps"] == str(STEPS)
    assert run.data.params["policy.model_name"] == "builtin:tiny-qwen2"
    history = mlflow.MlflowClient(store).get_metric_history(run.info.run_id, "grpo/loss")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(m.step, m.value) for m in history] == [(r["step"], pytest.approx(r["loss"])) for r in rows]
    assert "eval/held_out_reward" in run.data.metrics

    events = EventAccumulator(str(run_dir / "tensorboard"))  # on by default, as before loggers were plugins
    events.Reload()
    assert len(events.Scalars("grpo/loss")) == STEPS


def _wandb_records(run_file: Path) -> list[Any]:
    """The records of a W&B run file (LevelDB's log format: 32 KiB blocks of chunks, each with a
    4-byte checksum, a 2-byte length and a 1-byte type; full=1, first=2, middle=3, last=4), after
    its 7-byte header. wandb 0.31 ships no Python reader of it; the records are its protobufs."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, offset, block = run_file.read_bytes(), [], b"", 7, 32768
    assert data[:4] == b":W&B"
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a chunk header is padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        chunk, offset = data[offset + 7:offset + 7 + length], offset + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_wandb_offline_writes_its_run_with_the_config_and_every_step(tmp_path):
    run_dir = _run(tmp_path, wandb={"enabled": True, "mode": "offline", "project": "digits"},
                   tensorboard={"enabled": False})
    assert not (run_dir / "tensorboard").exists()
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records(run_file)
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    steps = [h for h in history if "grpo/loss" in h]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [h["_step"] for h in steps] == [r["step"] for r in rows]
    assert [h["grpo/loss"] for h in steps] == pytest.approx([r["loss"] for r in rows])
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"][:1]
    assert run.project == "digits" and run.display_name == "logged"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["algorithm.max_steps"] == STEPS


def _config(tmp_path: Path, **logger: Any):
    host = PluginHost(env={})
    return config_from_mapping(_recipe(tmp_path, **logger), host), host


def test_a_logger_that_cannot_start_stops_the_run_in_one_line_naming_its_key(tmp_path):
    config, host = _config(tmp_path, mlflow={"enabled": True, "tracking_uri": "nowhere://store"},
                           tensorboard={"enabled": False})
    with pytest.raises(RunError) as refused:
        start_loggers(config, host, tmp_path, resumed=False, warn=pytest.fail)
    line = refused.value.one_line()
    assert line.startswith("logger.mlflow.enabled: the mlflow logger could not start: ") and "nowhere://" in line
    assert "\n" not in line and "logger.mlflow.optional=true" in line


def test_an_optional_logger_that_cannot_start_is_one_warning_and_the_run_goes_on(tmp_path):
    config, host = _config(tmp_path, mlflow={"enabled": True, "optional": True, "tracking_uri": "nowhere://store"},
                           tensorboard={"enabled": False})
    warned: list[str] = []
    assert start_loggers(config, host, tmp_path, resumed=False, warn=warned.append) == []
    (line,) = warned
    assert line.startswith("logger.mlflow.enabled: the mlflow logger could not start (") and "optional=true" in line


def test_nemo_rl_logger_keys_switch_the_loggers_on(tmp_path):
    from corerl.config import load_config

    recipe = Path(__file__).parent / "data" / "nemo_rl" / "base_grpo.yaml"
    config = load_config(recipe, ["logger.wandb_enabled=true", "logger.wandb.project=p", "logger.wandb.name=n",
                                  "logger.mlflow_enabled=true", "logger.mlflow.experiment_name=e",
                                  "logger.mlflow.tracking_uri=sqlite:///x.db", "logger.tensorboard_enabled=false"],
                         PluginHost())
    wandb, mlflow, tensorboard = (config.section(f"logger.{name}") for name in ("wandb", "mlflow", "tensorboard"))
    assert (wandb.enabled, wandb.project, wandb.name) == (True, "p", "n")
    assert (mlflow.enabled, mlflow.experiment_name, mlflow.tracking_uri) == (True, "e", "sqlite:///x.db")
    assert tensorboard.enabled is False
    assert not any("W&B" in warning or "MLflow" in warning for warning in config.warnings)
