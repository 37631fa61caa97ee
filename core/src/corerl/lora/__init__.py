"""LoRA: a low-rank adapter trained on a frozen policy (``policy.lora``), through PEFT.

- :mod:`corerl.lora.adapter`: PEFT's LoRA on a Hugging Face model, adapter names, the adapter
  folder and the merged model (imports torch and peft when called);
- :mod:`corerl.lora.weights`: what crosses to a generation engine at a refit (the adapter only);
- :mod:`corerl.lora.reference`: the KL reference as the policy with its adapter switched off;
- :mod:`corerl.lora.checks`: what selection refuses (light: no torch).
"""
