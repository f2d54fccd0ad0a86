"""What a user imports to test code against kvformats (hypothesis is needed for ``strategies``
only; ``import kvformats`` imports neither module):

* ``strategies``: hypothesis strategies of layouts, rows and caches, for fuzzing a kernel or a
  serving engine's cache code against the reference;
* ``tolerance``: the bar for rows that are not bit-exact by design (the softmax-pooled compress).

The test suite's own harness (state machines, oracles, the stand-in launcher) lives in the
repository's ``tests/harness/``, not here."""
