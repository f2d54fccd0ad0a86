"""DeepSeek V4 indices kernels (being written)."""

OPS: dict = {}
