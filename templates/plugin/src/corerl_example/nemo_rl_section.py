"""The backend's section in NeMo RL's recipes: with this plugin installed, corerl's NeMo RL
dialect takes ``policy.example_cfg`` from a NeMo RL recipe (``corerl run nemo_rl_recipe.yaml``)
as this backend's section. A key without a rule means the same key of ``policy.example_cfg``;
the rules below are the keys NeMo RL would spell otherwise, or that do nothing here."""

from __future__ import annotations

from corerl.sdk import Rule, SectionRules

SECTION = SectionRules(
    rules={
        # NeMo RL's spelling -> the backend's own key (a corerl key: the value acts there unchanged)
        "policy.example_cfg.num_shards": "policy.example_cfg.shards",
        "policy.example_cfg.fused_kernels": Rule.inert(Rule.PERF),
        "policy.example_cfg.env_vars": Rule.inert_with_warning(Rule.ENV, Rule.truthy),
    },
    # `enabled: false` switches the whole section off (its keys are then inert); `enabled` itself acts
    switched={"policy.example_cfg": True},
    opaque=("policy.example_cfg.env_vars",),
)
