"""Count compiled Triton kernel launches by kernel name, through Triton's launch-enter hook.

    counter = LaunchCounter()
    counter.install()        # False where the hook is unavailable (the interpreter never calls it)
    ...                      # run kernels
    counter.total(), counter.counts   # launches, {kernel name: launches}
    counter.remove()

The interpreter (TRITON_INTERPRET=1) does not go through the compiled launcher, so a count above
zero is proof that compiled kernels ran. Triton 3.4+ keeps the hook as a chain (``add`` /
``remove``); older releases keep one callable in the attribute; both are handled.
"""

from __future__ import annotations

import collections


def _runtime_knobs():
    try:
        from triton import knobs
    except ImportError:
        return None
    return getattr(knobs, "runtime", None)


class LaunchCounter:
    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self._previous = None
        self._mode = None  # "chain" or "attribute" once installed

    def __call__(self, metadata) -> None:
        name = None
        try:
            # a dict, or Triton's LazyDict (3.x), whose get() takes no key and returns the dict
            data = metadata if metadata is None or isinstance(metadata, dict) else metadata.get()
            name = data.get("name") if data is not None else None
        except Exception:  # a LazyDict that fails to evaluate must not break the launch
            name = None
        self.counts[name or "?"] += 1
        if self._mode == "attribute" and self._previous is not None:
            self._previous(metadata)

    def install(self) -> bool:
        """Start counting; False (and nothing changed) where Triton has no launch hook."""
        rt = _runtime_knobs()
        if rt is None or not hasattr(rt, "launch_enter_hook"):
            return False
        hook = rt.launch_enter_hook
        if hasattr(hook, "add") and hasattr(hook, "remove"):
            hook.add(self)
            self._mode = "chain"
        else:
            self._previous = hook
            rt.launch_enter_hook = self
            self._mode = "attribute"
        return True

    def remove(self) -> None:
        rt = _runtime_knobs()
        if rt is None or self._mode is None:
            return
        if self._mode == "chain":
            rt.launch_enter_hook.remove(self)
        else:
            rt.launch_enter_hook = self._previous
        self._mode = None

    @property
    def installed(self) -> bool:
        return self._mode is not None

    def total(self) -> int:
        return sum(self.counts.values())
