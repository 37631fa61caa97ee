"""The config sections the core's algorithms own (``algorithm.dpo``, ``algorithm.ppo``), declared
by their registrations (:mod:`corerl.builtin_plugin`) as any plugin's algorithm declares its own.
Light: validation imports them without torch."""

from __future__ import annotations

from typing import Literal

import attrs

from corerl.config.fields import setting


@attrs.define(kw_only=True)
class DPOConfig:
    """``algorithm.dpo``: the preference loss (NeMo RL's ``dpo`` section maps here)."""

    beta: float = setting(0.1, min=0.0, min_exclusive=True,
                          help="strength of the pull towards the reference (NeMo RL: reference_policy_kl_penalty)")
    loss_type: Literal["sigmoid", "ipo"] = setting("sigmoid", help="sigmoid: DPO's logistic loss; ipo: IPO's squared loss")
    label_smoothing: float = setting(0.0, min=0.0, help="sigmoid loss: the assumed share of flipped preference labels")
    preference_weight: float = setting(1.0, min=0.0, help="weight of the preference term")
    sft_weight: float = setting(0.0, min=0.0, help="weight of an NLL term on the chosen response")
    preference_average_log_probs: bool = setting(False, help="per-token mean instead of summed logprobs in the "
                                                             "preference term")
    sft_average_log_probs: bool = setting(True, help="per-token mean NLL in the SFT term")
    precompute_reference_logprobs: bool = setting(
        True, help="score every pair with the starting weights once before training (no second model); false: a "
                   "frozen copy scores each batch (policy.reference.cpu_offload keeps it off the accelerator)")


@attrs.define(kw_only=True)
class PPOConfig:
    """``algorithm.ppo``: PPO's advantage estimation (the policy's clipped loss reads the
    ``algorithm`` keys GRPO uses; the critic is the ``critic`` section)."""

    gamma: float = setting(1.0, min=0.0, max=1.0, help="discount per response token")
    lam: float = setting(0.95, min=0.0, max=1.0, help="GAE's lambda: 0 one-step TD, 1 Monte Carlo returns")
    value_lam: float | None = setting(None, min=0.0, max=1.0, help="GAE's lambda for the critic's targets (VAPO's "
                                                                   "decoupled GAE); unset: lam")
    whiten_advantages: bool = setting(True, help="centre and scale the step's advantages over its response tokens")
    critic_warmup_steps: int = setting(0, min=0, help="steps that train only the critic before the policy moves")
