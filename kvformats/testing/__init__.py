"""Helpers shared by the test suite (tests/) and the scripts in tools/: the reliability harness
and its state machines, the DeepSeek V4 scenarios and their oracle, the sanitizer's cases, a
kernel-launch counter and a SASS reader. ``import kvformats`` does not import them; the state
machines need hypothesis. They check, rather than serve: failures are AssertionErrors."""
