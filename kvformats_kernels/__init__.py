"""Triton kernels for kvformats, imported lazily on the first CUDA call.

This version ships no kernels yet: every op runs on the reference backend, and
``backend="triton"`` raises BackendUnavailableError.
"""
