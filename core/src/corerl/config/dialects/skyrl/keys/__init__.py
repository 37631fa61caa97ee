"""The core's rules of SkyRL's dialect, by section: ``trainer.*`` (:mod:`.trainer`),
``trainer.algorithm.*`` and the fully asynchronous keys (:mod:`.algorithm`), ``generator.*``
(:mod:`.generator`), ``data.*`` and ``environment.*`` (:mod:`.data`) and the SFT entry point's
top-level keys (:mod:`.sft`); the keys SkyRL has (:mod:`.names`). An engine's section
(``trainer.policy.fsdp_config``, ``megatron_config``, the inference engine's own keys) is not here:
the plugin that registers the engine contributes it (``DialectSection(dialect="skyrl")``)."""

from __future__ import annotations

from corerl.config.dialects.rules import Rule
from corerl.config.dialects.skyrl.keys import algorithm, data, generator, names, sft, trainer

#: SkyRL key (or ``prefix.*``) -> what corerl does with it: the RL entry points' shared sections
RULES: dict[str, Rule] = {**trainer.RULES, **algorithm.RULES, **generator.RULES, **data.RULES}
#: the SFT entry point's own keys (its others take the RL key's rule: :data:`SFT_ALIASES`)
SFT_RULES: dict[str, Rule] = dict(sft.RULES)
SFT_ALIASES: dict[str, str] = dict(sft.ALIASES)
#: mappings taken whole (their keys are not SkyRL's own: arguments handed to a library)
OPAQUE_KEYS: tuple[str, ...] = (
    "trainer.policy.model_config_kwargs", "trainer.ref.model_config_kwargs", "trainer.critic.model_config_kwargs",
    "generator.chat_template_kwargs", "generator.sampling_params.additional_kwargs",
    "generator.eval_sampling_params.additional_kwargs", "generator.inference_engine.router_init_kwargs",
    "model_config_kwargs", "sampler_kwargs")
TRAIN_KEYS, SFT_KEYS = names.TRAIN_KEYS, names.SFT_KEYS
