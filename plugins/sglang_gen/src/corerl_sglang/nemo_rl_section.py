"""NeMo RL's SGLang section (``policy.generation.sglang_cfg``) in corerl's configuration: the rules
this plugin contributes to the core's NeMo RL dialect (a key without a rule means what the same key
of corerl's ``policy.generation.sglang_cfg`` means: ``tp_size``, ``dp_size``, ``pp_size``,
``ep_size``, ``random_seed``, ``mem_fraction_static``, ``context_length``,
``max_running_requests``, ``disable_cuda_graph``). No engine is imported here."""

from __future__ import annotations

from typing import Any

from corerl.sdk import Rule, SectionRules

acts, inert, refused, derived = Rule.acts, Rule.inert, Rule.refused, Rule.derived
_not = Rule.other_than

SECTION_KEY = "policy.generation.sglang_cfg"
_SERVERS = ("NeMo RL runs SGLang as HTTP servers behind a router; corerl drives one engine in a Ray actor of its "
            "own and hands it the step's requests itself")

RULES: dict[str, Rule] = {
    f"{SECTION_KEY}.model_path": derived("the engine starts on policy.model_name; another path is refused"),
    f"{SECTION_KEY}.dtype": derived("the engine runs in policy.precision; another precision is refused"),
    f"{SECTION_KEY}.allow_auto_truncate": inert("corerl's prompts and completions end within the engine's "
                                                "context_length (policy.max_seq_length), so nothing is cut"),
    f"{SECTION_KEY}.skip_server_warmup": inert(_SERVERS),
    f"{SECTION_KEY}.disable_piecewise_cuda_graph": acts(f"{SECTION_KEY}.disable_prefill_cuda_graph",
                                                        note="SGLang's piecewise (prefill) CUDA graphs"),
    f"{SECTION_KEY}.sglang_server_config.needs_offload": inert(
        "corerl's colocated sglang engine always frees the GPUs while training runs (sleep, wake)", _not(True)),
    f"{SECTION_KEY}.sglang_server_config.cpu_weight_backup": acts(f"{SECTION_KEY}.enable_weights_cpu_backup"),
    f"{SECTION_KEY}.sglang_server_config.num_gpus": inert("the GPUs of NeMo RL's SGLang servers; corerl's engine "
                                                          "takes tp_size x dp_size x pp_size of the training ranks' first node"),
    f"{SECTION_KEY}.sglang_server_config.num_gpus_per_engine": derived("must equal tp_size, as NeMo RL's recipes "
                                                                       "set it; another value is refused"),
    f"{SECTION_KEY}.sglang_server_config.*": inert(_SERVERS),
    f"{SECTION_KEY}.sglang_router_config.use_external_router": inert(
        "NeMo RL's router in front of SGLang servers started elsewhere; corerl starts its own engine", Rule.truthy),
    f"{SECTION_KEY}.sglang_router_config.*": inert(_SERVERS),
}


def translate(raw: dict[str, Any], out: Any) -> None:
    """``model_path``, ``dtype`` and ``num_gpus_per_engine`` restate the policy's model, its
    precision and ``tp_size``: accepted where they do, refused where they say otherwise."""
    prefix = "generation" if out.eval_recipe else "policy.generation"
    section = f"{prefix}.sglang_cfg"
    model = out.value("policy.model_name") or out.value("generation.model_name")
    precision = out.value("policy.precision")
    tp_size = out.value(f"{section}.tp_size") or 1
    for key, expected, what in ((f"{section}.model_path", model, "policy.model_name"),
                                (f"{section}.dtype", precision, "policy.precision"),
                                (f"{section}.sglang_server_config.num_gpus_per_engine", tp_size, f"{section}.tp_size")):
        value = out.value(key)
        if value is None:
            continue
        if expected is not None and value != expected:
            out.refuse(key, f"{value!r} differs from {what} ({expected!r}); corerl's sglang engine takes {what}",
                       hint=f"remove the key or make it {what}")
        else:
            out.refate(key, "inert", f"restates {what}")


SECTION = SectionRules(rules=RULES, derived=translate)
