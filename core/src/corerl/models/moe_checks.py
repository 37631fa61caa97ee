"""What selection refuses for a mixture-of-experts policy on backends that do not take one (config
logic only: nothing heavy is imported). The model's own facts are checked in
:mod:`corerl.models.facts`; this is the registrations' side, as :mod:`corerl.lora.checks` is for
LoRA."""

from __future__ import annotations

from typing import Any

from corerl.models.facts import model_shape, source_of


def check_moe_support(config: Any, training: Any, generation: Any) -> None:
    """Refuse a mixture-of-experts policy on a training or generation backend whose registration
    does not say ``moe=True`` (``generation`` is None where the algorithm samples nothing)."""
    from corerl.errors import SelectionError, origin_of

    shape = model_shape(config)
    if shape is None or not shape.is_moe:
        return
    source = origin_of("policy.model_name", config.origins)
    for registration, key, kind in ((training, "policy.training_backend", "train"),
                                    (generation, "policy.generation.backend", "sample")):
        if registration is not None and not registration.moe:
            raise SelectionError(f"{source_of(config)} is a mixture-of-experts model ({shape.experts} experts); "
                                 f"{registration.kind} {registration.id!r} (plugin {registration.plugin!r}) does not "
                                 f"{kind} such models", key=key, source=origin_of(key, config.origins) or source,
                                 hint="pick a backend whose registration says moe=True (corerl plugins lists them)")


def check_moe_chosen(config: Any, chosen: Any) -> None:
    """The validation table's row (:mod:`corerl.config.validation`): :func:`check_moe_support`
    against the chosen training backend and, where the algorithm samples, generation backend."""
    check_moe_support(config, chosen.training_backend, chosen.generation_backend)
