"""The real-pair benchmark: Qwen2.5-Coder 1.5B target, 0.5B draft."""
