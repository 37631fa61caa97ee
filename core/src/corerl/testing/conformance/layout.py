"""The layouts every conformance class is: :class:`ConformanceLayout` (the checks a layout does
not run are deselected), :class:`BackendLayout` (a training backend under test: its recipe,
selection, engine and registration) and :class:`TrainingLayout` (the tiny dense model and the
engine the training suite's checks share)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from corerl.errors import ConfigError
from corerl.testing.conformance.inputs import LR, MAX_GRAD_NORM, MOMENTUM, conformance_batch
from corerl.testing.contract_versions import ContractCheck, stated_contract

#: each layout class's registration, as :meth:`BackendLayout._registration_or_none` found it
_REGISTRATIONS: dict[type, Any] = {}


class ConformanceLayout:
    """The base of every conformance class: a layout declares, through class attributes, the
    checks it does not run, and those are not collected. corerl's pytest plugin (loaded through
    the ``pytest11`` entry point, so in a plugin's own project too) asks each collected test's
    class :meth:`conformance_deselected` and deselects the test where it gives a reason; pytest
    reports them as "N deselected" (``-v`` lists each with its reason at the end). A skip is
    left for what cannot run on this machine (no GPU, an engine refusing here), saying why."""

    @classmethod
    def conformance_deselected(cls, test: str, params: Mapping[str, Any]) -> str | None:
        """Why this layout does not run the suite's check ``test`` (the test function's name)
        with ``params`` (its parametrization, e.g. ``{"layout": "packed"}``), or None where it
        runs it. A subclass adding reasons calls ``super()``; a test the subclass defines itself
        under a suite check's name is never deselected."""
        return None

    @classmethod
    def _suite_check(cls, test: str, suite: type) -> bool:
        """Whether ``test`` is ``suite``'s own check on this class (not one the subclass redefines):
        defined by ``suite`` or by a class it is composed of (:class:`TrainingBackendConformance`'s
        checks are its mixins')."""
        owner = next((klass for klass in suite.__mro__ if test in vars(klass)), None)
        return owner is not None and getattr(cls, test, None) is vars(owner)[test]

    def _skip_if_deselected(self, test: str, **params: Any) -> None:
        """Where corerl's pytest plugin is not loaded (``-p no:corerl``), the check deselection
        would have left out skips, with the same reason."""
        reason = type(self).conformance_deselected(test, params)
        if reason is not None:
            pytest.skip(reason)


class BackendLayout(ConformanceLayout):
    """One layout of a training backend under test (no checks of its own): ``backend_id``, the
    ``overrides`` that make the layout (world size, parallel sizes), and how the suites build a
    selection and an engine from them."""

    backend_id: ClassVar[str]
    overrides: ClassVar[list[str]] = []
    #: a plugin object to register instead of discovering installed plugins (optional)
    plugin: ClassVar[Any] = None

    @classmethod
    def _build(cls, model_dir: str, tmp_path: Path, extra: list[str], critic: bool = False) -> Any:
        """(config, engine) of this layout; ``critic``: PPO's critic (its own config and role)."""
        config, selection = cls._select(model_dir, tmp_path, [*extra, *(["algorithm.name=ppo"] if critic else [])])
        choice = selection.critic_backend if critic else selection.training_backend
        assert choice.id == cls.backend_id, choice.reason
        if critic:
            config = selection.critic_config
        return config, choice.registration.create(config=config)

    @classmethod
    def _select(cls, model_dir: str, tmp_path: Path, extra: list[str]) -> Any:
        """(config, selection) of this layout's recipe with ``extra`` overrides."""
        from corerl.testing import host_with, select_for, write_recipe

        host = host_with(cls.plugin, f"{cls.backend_id}-under-test")
        recipe = write_recipe(tmp_path / "conformance.yaml", {
            "policy": {
                "model_name": model_dir, "precision": "float32", "train_micro_batch_size": 2,
                "max_grad_norm": MAX_GRAD_NORM, "training_backend": cls.backend_id,
                "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
                "scheduler": {"name": "linear", "warmup_steps": 2},
                # the suite tests training backends: the core's own sampler, whatever the tiny model's head size
                "generation": {"backend": "hf"},
            },
            "critic": {  # PPO's critic (j): the same plain SGD step as the reference
                "max_grad_norm": MAX_GRAD_NORM, "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
                "scheduler": {"name": "linear", "warmup_steps": 2},
            },
            "algorithm": {"max_steps": 8, "seed": 1234},
        })
        return select_for(host, recipe, [*cls.overrides, *extra])

    @classmethod
    def _registration(cls) -> Any:
        from corerl.testing import host_with

        registration = host_with(cls.plugin, f"{cls.backend_id}-under-test").training_backends.get(cls.backend_id)
        assert registration is not None, f"no training backend {cls.backend_id!r} is registered"
        return registration

    @classmethod
    def _contract(cls) -> ContractCheck:
        """The backend held to the contract version its plugin states (none: the oldest supported);
        a check that reads what a later version added fails, or skips, in one line
        (:mod:`corerl.testing.contract_versions`)."""
        from corerl.testing import host_with

        host = host_with(cls.plugin, f"{cls.backend_id}-under-test")
        registration = host.training_backends.get(cls.backend_id)
        assert registration is not None, f"no training backend {cls.backend_id!r} is registered"
        return ContractCheck(f"training backend {cls.backend_id!r} (plugin {registration.plugin!r})",
                             stated_contract(host, registration))

    @classmethod
    def _world_size(cls) -> int:
        """The layout's world size as its ``overrides`` set it (nodes x workers per node; 1 each unset)."""
        def last(key: str) -> int:
            sizes = [o.split("=", 1)[1] for o in cls.overrides if o.startswith(f"{key}=")]
            if not sizes:
                return 1
            try:
                return int(sizes[-1])
            except ValueError:  # the layout's mistake, in one line (its recipe fails on it too)
                raise ConfigError(f"{sizes[-1]!r} is not a whole number", key=key,
                                  source=f"{cls.__qualname__}.overrides") from None

        return last("cluster.num_nodes") * last("cluster.gpus_per_node")

    @classmethod
    def _registration_or_none(cls) -> Any:
        """The registration, or None where it cannot be found (the checks then run and fail saying
        so); looked up once per class (collection asks for each of its tests)."""
        if cls not in _REGISTRATIONS:
            try:
                _REGISTRATIONS[cls] = cls._registration()
            except Exception:  # noqa: BLE001 (collection goes on; the test names the problem when it runs)
                _REGISTRATIONS[cls] = None
        return _REGISTRATIONS[cls]


class TrainingLayout(BackendLayout):
    """A layout of the training suite (:class:`TrainingBackendConformance`, composed of the checks'
    mixins): the tiny dense model, the layout's engine (built once per class) and the batch its
    checks share."""

    #: the tiny model's architecture family: "qwen2" (biased q/k/v, tied embeddings) or "llama" (untied)
    model_family: ClassVar[str] = "qwen2"
    tolerance: ClassVar[float] = 1e-5

    # -- fixtures ----------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> str:
        from corerl.models.tiny import build_tiny_model

        return str(build_tiny_model(
            tmp_path_factory.mktemp("tiny-model"), family=cls.model_family, hidden_size=64, num_layers=2,
            tie_word_embeddings=cls.model_family == "qwen2",
        ))

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        config, backend = cls._build(model_dir, tmp_path_factory.mktemp("recipe"), [])
        backend.conformance_world_size = config.core.cluster.world_size
        try:
            yield backend
        finally:
            backend.shutdown()

    @pytest.fixture
    def batch(self) -> dict[str, torch.Tensor]:
        return conformance_batch()

    def _check_packed_critic(self, model_dir: str, tmp_path: Path, section: str) -> None:
        """(j) in (g)'s packed layout (``section``: the recipe's packing section), where the suite
        checks a critic (:class:`~corerl.testing.conformance.critic.CriticChecks` overrides this);
        nothing here."""
