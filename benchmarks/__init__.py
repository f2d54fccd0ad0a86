"""kvformats' benchmarks: one package, run from the repository root as

    python3 -m benchmarks <name> [options]      # python3 -m benchmarks --list names them

Each benchmark prints a table (and writes JSON where it takes ``--json``); the figures go into
docs/performance.md and docs/pipeline.md with their date, device and commit. Names ending in
``_gpu`` need a CUDA device; ``_cpu`` ones run anywhere. What the benchmarks share is here too:
``gpu_timing`` (CUDA-graph and event timing, the copy bandwidth), ``traffic`` (the bytes an op
must move), ``dsv4_case`` and ``dsv4_cases_*`` (the deepseek_v4 cases).
"""
