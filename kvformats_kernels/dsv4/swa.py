"""DeepSeek V4 swa kernels (being written)."""

OPS: dict = {}
