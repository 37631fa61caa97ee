"""NeMo RL's run sections in corerl's configuration: ``checkpointing``, ``logger``, ``cluster`` and
its ``data_plane``."""

from __future__ import annotations

from corerl.config.dialects.rules import (
    Rule,
    _not,
    _truthy,
    acts,
    derived,
    inert,
    inert_with_warning,
)

RULES: dict[str, Rule] = {
    # -- checkpointing --
    "checkpointing.keep_top_k": derived("with a metric corerl logs: checkpointing.keep_top_k (the best k, and the "
                                        "newest); else checkpointing.keep_last (the newest k)"),
    "checkpointing.checkpoint_dir": inert("checkpoints live in <run dir>/checkpoints; set run.output_dir and run.name"),
    "checkpointing.metric_name": derived("checkpointing.metric_name: val:accuracy and val:total_reward/mean are "
                                         "eval/mean@n, val:pass_k eval/pass@n (with evaluation during training), "
                                         "train:loss loss, train:total_reward/mean and train:reward reward/mean; "
                                         "another metric, or validation off, keeps the newest checkpoints (with a "
                                         "warning where NeMo RL would rank them)"),
    "checkpointing.higher_is_better": derived("with a metric corerl logs: checkpointing.higher_is_better"),
    "checkpointing.checkpoint_must_save_by": acts("checkpointing.save_by"),
    "checkpointing.model_save_format": inert("a storage format only: corerl's checkpoints are its backends' own "
                                             "format and final/ is safetensors"),
    "checkpointing.save_consolidated": inert("final/ is always a consolidated Hugging Face checkpoint"),
    "data_plane.*": inert("NeMo RL's distributed data plane moves rollouts between its workers; corerl's pass "
                          "through the driver"),
    "checkpointing.save_optimizer": inert("a resumable checkpoint always holds the optimizer state", _not(True)),
    "cluster.segment_size": inert("NeMo RL's placement segments; corerl places ranks with Ray placement groups"),
    "cluster.master_port_range_low": inert("corerl picks free rendezvous ports itself"),
    "cluster.master_port_range_high": inert("corerl picks free rendezvous ports itself"),
    # -- logger --
    "logger.log_dir": inert("metrics.jsonl and TensorBoard files are written in the run directory"),
    "logger.tensorboard_enabled": acts("logger.tensorboard.enabled"),
    "logger.tensorboard.*": inert("TensorBoard files go to <run dir>/tensorboard"),
    "logger.wandb_enabled": acts("logger.wandb.enabled"),
    "logger.wandb.project": acts("logger.wandb.project"),
    "logger.wandb.name": acts("logger.wandb.name"),
    "logger.wandb.entity": acts("logger.wandb.entity"),
    "logger.wandb.mode": acts("logger.wandb.mode"),  # corerl's own keys, for a laptop without a W&B login
    "logger.wandb.optional": acts("logger.wandb.optional"),
    "logger.wandb.*": inert("a W&B setting corerl's W&B logger does not have (corerl logs metrics and the recipe)"),
    "logger.mlflow_enabled": acts("logger.mlflow.enabled"),
    "logger.mlflow.experiment_name": acts("logger.mlflow.experiment_name"),
    "logger.mlflow.run_name": acts("logger.mlflow.run_name"),
    "logger.mlflow.tracking_uri": acts("logger.mlflow.tracking_uri"),
    "logger.mlflow.optional": acts("logger.mlflow.optional"),
    "logger.mlflow.*": inert("an MLflow setting corerl's MLflow logger does not have"),
    "logger.swanlab_enabled": inert_with_warning("SwanLab logging is not built into corerl yet: the run logs to "
                                              "metrics.jsonl and its other loggers", _truthy),
    "logger.swanlab.*": inert("used only with SwanLab logging"),
    "logger.monitor_gpus": inert("the run reports accelerator memory itself"),
    "logger.gpu_monitoring.*": inert("the run reports accelerator memory itself"),
    "logger.num_val_samples_to_print": inert("no samples are printed"),
}

SWITCHED_SECTIONS = {"checkpointing": True}
