"""SkyRL's SFT entry point (``skyrl.train.main_sft``): its keys lie at the top level. Those that mean
what an RL key does take that key's rule (:data:`ALIASES`: ``model.path`` is
``trainer.policy.model.path``); the SFT-only ones have their own (:data:`RULES`)."""

from __future__ import annotations

from corerl.config.dialects.rules import Rule, _truthy, acts, derived, inert, refused

_PERF = "a memory or speed switch of SkyRL's: the same updates; corerl leaves the choice to its backend"

_LOG = "SkyRL's logging and bookkeeping; corerl logs each step's metrics under run.output_dir"
_OFF = "a switch SkyRL leaves off by default; corerl has no such feature, so only false is accepted"

#: SFT key (or section) -> the RL key (or section) whose rule it takes
ALIASES: dict[str, str] = {
    **{section: f"trainer.policy.{section}" for section in (
        "model", "optimizer_config", "sequence_parallel_size", "model_config_kwargs", "use_torch_compile",
        "record_memory", "torch_profiler_config")},
    **{key: f"trainer.{key}" for key in (
        "seed", "logger", "project_name", "run_name", "tags", "ckpt_path", "max_ckpts_to_keep", "hf_save_interval",
        "export_path", "enable_ray_gpu_monitor", "micro_train_batch_size_per_gpu", "max_training_steps")},
}

RULES: dict[str, Rule] = {
    "placement.num_nodes": acts("cluster.num_nodes"),
    "placement.num_gpus_per_node": acts("cluster.gpus_per_node"),
    "batch_size": acts("algorithm.batch_size"),
    "num_steps": acts("algorithm.max_steps"),
    "num_epochs": derived("without num_steps: the steps of that many epochs, counted from the rows "
                          "(algorithm.max_steps)"),
    "max_length": acts("policy.max_seq_length"),
    "train_datasets": derived("local parquet/JSON files or folders: data.train_files (a Hugging Face dataset "
                              "name: data.hub_dataset)"),
    "dataset_name": derived("data.hub_dataset"),
    "eval_datasets": derived("local files: data.held_out_files"),
    "eval_dataset_name": derived("data.hub_dataset's held-out split"),
    "train_dataset_splits": derived("one split's first rows (train[:N]): data.max_train_rows N; another row slice, "
                                    "or several datasets' slices: data.train_rows (each file's rows)"),
    "dataset_split": inert("corerl reads the dataset's train split"),
    "eval_dataset_splits": derived("a row slice of each eval dataset (train[-500:]): data.held_out_rows of "
                                   "data.held_out_files (eval_datasets); a whole split: the whole files"),
    "eval_dataset_split": inert("corerl holds out rows of the files given"),
    "eval_dataset_names": inert(_LOG),
    "train_dataset_weights": derived("several datasets: data.train_file_weights (each batch's share of each file; "
                                     "unset: equal shares, as SkyRL's); one dataset's weight changes nothing"),
    "pretokenized_dataset_paths": refused("pre-tokenized datasets are not read by corerl (it tokenizes the rows)"),
    "eval_pretokenized_dataset_paths": refused("pre-tokenized datasets are not read by corerl"),
    "messages_key": acts("data.prompt_key", note="the chat-message column: each row a conversation whose assistant "
                                                 "turns are trained (data.train_on)"),
    "tools_key": acts("data.tools_key", note="each row's tool schemas, passed to the chat template (its tools "
                                             "argument); a row without the column has none"),
    "system_key": acts("data.system_key", note="each row's system prompt, a system turn before its messages where "
                                               "they do not start with one; a row without the column has none"),
    "train_on_what": acts("data.train_on", note="last_assistant_message: the last assistant turn, the messages "
                                                "before it the prompt; all_assistant_messages: every assistant turn "
                                                "in one sequence, the other turns untrained context"),
    "eval_interval": inert("corerl evaluates the held-out rows before and after training"),
    "eval_before_train": inert("corerl always evaluates the held-out rows before training"),
    "ckpt_interval": derived("above 0: checkpointing.enabled and checkpointing.save_period"),
    "resume_from": derived("empty: a new run; latest: run.resume auto; a folder is refused"),
    "num_workers": inert("corerl reads the rows in the driver"),
    "async_batch_collation": inert(_PERF),
    "dataloader_num_workers": inert("corerl reads the rows in the driver"),
    "dataloader_persistent_workers": inert("corerl reads the rows in the driver"),
    "sampler": inert("corerl shuffles the rows", lambda v: v not in ("random", None)),
    "sampler_class_path": refused("a custom sampler class is not built into corerl"),
    "sampler_kwargs": inert("used only by sampler_class_path (refused)", _truthy),
    "cache_dir": inert("corerl caches the tokenized rows in its own cache"),
    "force_recache": inert("corerl caches the tokenized rows in its own cache"),
    "disable_cache": inert("corerl caches the tokenized rows in its own cache"),
    "remove_microbatch_padding": inert("memory and speed only: corerl pads a micro-batch's rows"),
    "use_sequence_packing": acts("policy.sequence_packing.enabled"),
    "max_tokens_per_microbatch": derived("with use_sequence_packing: policy.sequence_packing.train_mb_tokens (the "
                                         "tokens of each packed micro-batch; null: max_length); without it unused, "
                                         "as in SkyRL's SFT (not the RL trainer's dynamic batching)"),
    "dummy_run_full_ctx": derived("true: data.full_context (every batch made-up sequences of max_length tokens, a "
                                  "memory check), dummy_run_max_steps steps"),
    "dummy_run_max_steps": derived("with dummy_run_full_ctx: algorithm.max_steps (num_steps is not used); else "
                                   "unused"),
}
