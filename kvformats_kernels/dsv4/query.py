"""DeepSeek V4 query kernels (being written)."""

OPS: dict = {}
