"""vllm-specextend: SpecExtend's Cross-model Retrieval for vLLM draft models."""

__version__ = "0.1.0"
