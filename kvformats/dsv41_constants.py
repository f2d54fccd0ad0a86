"""Constants of the DeepSeek V4.1 model ops that their Triton kernels read too (they live below
both: the kernels must not import ``kvformats.deepseek_v41``, whose modules dispatch through the
registry that reads the kernels' table)."""

FAMILY = "deepseek_v41"  # the model ops' family: the registry keys them under OpFamily(FAMILY)
