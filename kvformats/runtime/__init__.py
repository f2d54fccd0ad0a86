"""How a call runs: value checks deferred to the device (``deferred``) and the replay of a
call's kernel launches (``replay``, ``replay_plan``)."""
