"""A training service that speaks the Tinker API: many LoRA adapters on one base model (issue 76).

``engine`` holds the engine-neutral types and the protocol the HTTP server calls; ``peft_engine`` is
one engine (Hugging Face model, PEFT adapters, torch Adam per adapter). Nothing here imports torch.
"""
