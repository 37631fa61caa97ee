"""A mixture-of-experts model under DeepSpeed ZeRO-3 at world size 1 (its experts ordinary
parameters, partitioned as every other), through the conformance suite's MoE checks
(:class:`corerl.testing.conformance.MoeConformance`): logprobs, one step with the router's loss
terms against a plain PyTorch step, the routers' metrics, the weight stream and export, save and
load. ZeRO-3 stands for ZeRO-1 and 2 as well (measured: one such step equals plain PyTorch within
2e-5 under ZeRO 1, 2 and 3; 1 and 2 share DeepSpeed's optimizer class and leave parameters whole).
Slow tier: the engine is a Ray actor, built once for the class."""

from __future__ import annotations

from corerl.testing.conformance import MoeConformance


class TestMoeZero3World1(MoeConformance):
    backend_id = "deepspeed"
    overrides = ["cluster.gpus_per_node=1", "policy.deepspeed_cfg.zero_stage=3"]
