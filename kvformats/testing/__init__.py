"""Helpers shared by the test suite (tests/) and the scripts in tools/: the reliability harness
and its state machines, the DeepSeek V4 scenarios and their oracle, the sanitizer's cases, a
kernel-launch counter and a SASS reader. ``import kvformats`` does not import them; the state
machines need hypothesis. They check, rather than serve: failures are AssertionErrors. Two modules here are public
API: ``strategies`` (hypothesis strategies for fuzzing a kernel against the reference) and
``tolerance`` (the bar for rows that are not bit-exact by design)."""
