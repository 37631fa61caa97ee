"""Where a section of a recipe lives when a feature has a copy of another's: the critic's layout
of a training backend sits under ``critic.`` where the policy's sits under ``policy.``.

The loader (:func:`corerl.config.owned_sections`) names these paths before any config exists;
:mod:`corerl.config.critic`, which builds the critic's config from a loaded one, re-exports them.
"""

from __future__ import annotations


def critic_section(policy_section: str) -> str:
    """``policy.dtensor_cfg`` -> ``critic.dtensor_cfg``: where the critic's layout of a backend goes."""
    return "critic." + policy_section.split(".", 1)[1]
