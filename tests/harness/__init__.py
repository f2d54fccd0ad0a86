"""The test suite's harness, shared by tests/, tools/ and benchmarks/: the reliability harness and
its state machines, the prepared public calls, the DeepSeek V4 scenarios and their oracle, the
sanitizer's cases, the CPU stand-in launcher, a kernel-launch counter, a SASS reader and the
prefill / decode transfer pattern. It is not part of the library (the wheel ships none of it):
its checks fail with AssertionError, as tests do, and some of it drives ``kvformats_kernels``
directly, which the library reaches only through the registry's kernel table.

Import it as ``tests.harness.<module>`` with the repository root on the path (pytest's
``pythonpath``, ``python3 -m benchmarks`` from the root, the scripts of tools/ insert it). One
name only: its counters and the launcher it registers are module state, which a second copy
under another name would not share."""

if __name__ != "tests.harness":
    raise ImportError(f"import the harness as tests.harness, not {__name__} (one copy of its module state)")
