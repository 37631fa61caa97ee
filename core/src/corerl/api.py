"""The Python API: the same runs as ``corerl run``, started from Python.

    import corerl
    result = corerl.train(model="path/to/hf_checkpoint", dataset="train.jsonl", reward_fn=my_reward)

    trainer = corerl.GRPOTrainer.from_pretrained("path/to/hf_checkpoint", tensor_parallel_size=2)
    trainer = corerl.GRPOTrainer({"policy": {"model_name": ...}, "algorithm": {"max_steps": 50}})
    trainer = corerl.SFTTrainer.from_recipe("recipe.yaml", "algorithm.max_steps=10")
    result = trainer.train()   # a RunResult: run_dir, summary, interrupted

A config dict has the sections and keys of a recipe file and is validated the same way
(errors raise :class:`corerl.errors.CorerlError` with the key path).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from corerl.config.tree import deep_merge, set_at
from corerl.errors import ConfigError

RewardFunction = Callable[[str, Mapping[str, Any]], float]


class Trainer:
    """A run of one algorithm, configured by a recipe dict; :meth:`train` runs it."""

    algorithm: ClassVar[str] = "grpo"

    def __init__(self, config: Mapping[str, Any] | None = None, *, dataset: Any = None,
                 reward_fn: RewardFunction | None = None, overrides: Sequence[str] = ()) -> None:
        """``config``: a recipe as nested dicts; ``dataset``: a JSONL/Parquet path, a list of
        row dicts, or a ``datasets.Dataset``/``DatasetDict`` (``train`` and optional ``test``);
        ``reward_fn(completion, example) -> float`` replaces ``data.reward``; ``overrides``:
        ``key=value`` strings as on the command line."""
        tree = copy.deepcopy(dict(config or {}))
        algorithm = tree.setdefault("algorithm", {})
        named = algorithm.get("name", self.algorithm) if isinstance(algorithm, Mapping) else self.algorithm
        if named != self.algorithm:
            raise ConfigError(f"{type(self).__name__} runs {self.algorithm!r}, the config says {named!r}",
                              key="algorithm.name", hint=f"drop algorithm.name or use the trainer for {named!r}")
        if isinstance(algorithm, dict):
            algorithm["name"] = self.algorithm
        self.tree = tree
        self.dataset = dataset
        self.reward_fn = reward_fn
        self.overrides = list(overrides)
        self.recipe_path: str | None = None

    @classmethod
    def from_pretrained(cls, model_path: str | Path, *, tensor_parallel_size: int = 1, backend: str | None = None,
                        dataset: Any = None, reward_fn: RewardFunction | None = None,
                        **sections: Mapping[str, Any]) -> Trainer:
        """A run on a local Hugging Face checkpoint with training ``backend`` (a registered id; None:
        the default, :data:`corerl.known_plugins.DEFAULT_TRAINING_BACKEND`) at
        ``tensor_parallel_size`` ranks of tensor parallelism; ``sections`` (``algorithm={...}``,
        ``data={...}``, ...) are merged into the config."""
        from corerl.known_plugins import DEFAULT_TRAINING_BACKEND
        from corerl.plugin_manager import process_host

        backend = backend or DEFAULT_TRAINING_BACKEND

        registration = process_host().training_backends.get(backend)
        if registration is None or registration.config_section is None:
            known = ", ".join(process_host().training_backends.ids())
            raise ConfigError(f"no training backend {backend!r} with a config section is installed", key="backend",
                              hint=f"installed: {known}")
        settings: dict[str, Any] = {"enabled": True}
        if tensor_parallel_size > 1 or registration.tensor_parallel_key:
            if registration.tensor_parallel_key is None:
                raise ConfigError(f"training backend {backend!r} has no tensor parallelism",
                                  key="tensor_parallel_size", hint="leave it at 1, or pick another backend")
            settings[registration.tensor_parallel_key] = tensor_parallel_size
        tree: dict[str, Any] = {"cluster": {"gpus_per_node": tensor_parallel_size},
                                "policy": {"model_name": str(model_path), "training_backend": backend}}
        set_at(tree, registration.config_section, settings)
        return cls(deep_merge(tree, sections), dataset=dataset, reward_fn=reward_fn)

    @classmethod
    def from_recipe(cls, path: str | Path, *overrides: str, dataset: Any = None,
                    reward_fn: RewardFunction | None = None) -> Trainer:
        """A run of a recipe file (with ``defaults:``) and ``key=value`` overrides."""
        trainer = cls(None, dataset=dataset, reward_fn=reward_fn, overrides=[f"algorithm.name={cls.algorithm}", *overrides])
        trainer.recipe_path = str(path)
        return trainer

    def train(self) -> Any:
        """Validate, select the backends and run; returns a :class:`corerl.run.loop.RunResult`."""
        import attrs

        from corerl.config.selection import Choice, select
        from corerl.plugin_manager import process_host
        from corerl.run.loop import execute

        host = process_host()
        config = self._load(host, {})
        if self.dataset is not None:  # point data.* at the dataset, written into the run directory
            name = config.core.run.name or time.strftime("%Y%m%d-%H%M%S")
            algorithm = host.algorithms.get(self.algorithm)
            pairs = algorithm is not None and algorithm.consumes == "preferences"
            data = dataset_settings(self.dataset, Path(config.core.run.output_dir) / name / "data",
                                    "preferences" if pairs else "dataset")
            config = self._load(host, {"run": {"name": name}, "data": data})
        selection = select(config, host)
        if self.reward_fn is not None:
            name = getattr(self.reward_fn, "__qualname__", type(self.reward_fn).__name__)
            selection = attrs.evolve(selection, reward=Choice(name, "reward_fn passed to the trainer"),
                                     reward_fn=self.reward_fn)
        return execute(config, selection, host)

    def _load(self, host: Any, extra: dict[str, Any]) -> Any:
        from corerl.config import config_from_mapping, load_config
        from corerl.config.overrides import apply_overrides, parse_override

        if self.recipe_path is not None:
            flat = [f"{section}.{key}={json.dumps(value)}" for section, values in extra.items() for key, value in values.items()]
            return load_config(self.recipe_path, [*self.overrides, *flat], host)
        tree = copy.deepcopy(self.tree)
        apply_overrides(tree, [parse_override(o, host) for o in self.overrides], {})
        return config_from_mapping(deep_merge(tree, extra), host)


def dataset_settings(dataset: Any, folder: Path, task: str = "dataset") -> dict[str, Any]:
    """``data`` settings for a dataset given as a path, rows, or a ``datasets`` object; Python
    objects are written as JSONL into ``folder`` (so a resumed run finds them)."""
    if isinstance(dataset, (str, Path)):
        return {"task": task, "train_files": str(dataset)}
    settings: dict[str, Any] = {"task": task}
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in _splits(dataset).items():
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        settings["train_files" if split == "train" else "held_out_files"] = str(path)
    return settings


def _splits(dataset: Any) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows}`` plus ``"test"`` when the dataset has that split."""
    if isinstance(dataset, Mapping) and "train" in dataset:  # a DatasetDict, or a dict of row lists
        splits = {"train": _rows(dataset["train"])}
        if "test" in dataset:
            splits["test"] = _rows(dataset["test"])
        return splits
    return {"train": _rows(dataset)}


def _rows(data: Any) -> list[dict[str, Any]]:
    rows = data.to_list() if hasattr(data, "to_list") else list(data)
    if not rows or not all(isinstance(r, Mapping) for r in rows):
        raise ConfigError("dataset must hold rows as mappings (e.g. {'prompt': ..., 'answer': ...})",
                          key="dataset", hint="pass a list of dicts, a datasets.Dataset, or a JSONL/Parquet path")
    return [dict(r) for r in rows]


class GRPOTrainer(Trainer):
    """GRPO (with the recipe's optional SFT warm start) from Python."""

    algorithm = "grpo"


class PPOTrainer(Trainer):
    """PPO with a critic from Python (the ``critic`` section as a keyword: ``critic={...}``)."""

    algorithm = "ppo"


class SFTTrainer(Trainer):
    """Supervised fine-tuning alone from Python."""

    algorithm = "sft"


class DPOTrainer(Trainer):
    """DPO from Python; ``dataset`` rows hold ``prompt``, ``chosen`` and ``rejected`` (the
    ``preferences`` task; ``data.*_key`` rename the columns)."""

    algorithm = "dpo"


def train(*, model: str | Path, dataset: Any = None, reward_fn: RewardFunction | None = None,
          algorithm: str | Mapping[str, Any] = "grpo", tensor_parallel_size: int = 1,
          **sections: Mapping[str, Any]) -> Any:
    """One call: a run on a local checkpoint ``model`` (or ``builtin:tiny-qwen2``).

    ``algorithm`` is a registered algorithm id (``"grpo"``, ``"ppo"``, ``"sft"``, ``"dpo"``, a plugin's) or the whole ``algorithm`` section (its ``name``
    defaulting to grpo); other sections come as keywords (``policy={...}``, ``data={...}``).
    See :class:`Trainer` for ``dataset`` and ``reward_fn``."""
    section = dict(algorithm) if isinstance(algorithm, Mapping) else {"name": algorithm}
    name = section.get("name", GRPOTrainer.algorithm)
    from corerl.plugin_manager import process_host

    installed = process_host().algorithms
    if name not in installed:
        raise ConfigError(f"unknown algorithm {name!r}", key="algorithm.name",
                          hint=f"use one of {', '.join(installed.ids())} (corerl plugins lists them)")
    trainers = {cls.algorithm: cls for cls in Trainer.__subclasses__()}
    # a plugin's algorithm runs through a Trainer of its own name
    trainer = trainers.get(name) or type(f"Trainer_{name}", (Trainer,), {"algorithm": name})
    return trainer.from_pretrained(model, tensor_parallel_size=tensor_parallel_size, dataset=dataset,
                                          reward_fn=reward_fn, algorithm=section, **sections).train()
