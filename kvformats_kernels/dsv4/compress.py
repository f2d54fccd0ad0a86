"""DeepSeek V4 compress kernels (being written)."""

OPS: dict = {}
