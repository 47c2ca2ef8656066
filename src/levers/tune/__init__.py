"""``levers tune``: the fastest stack of levers that keeps parity on one step, proven by A/B.

- :mod:`levers.tune.candidates`: the levers to try (the audit's and the catalogue's) and why
  others are left out;
- :mod:`levers.tune.search`: greedy forward selection by paired A/B under a time budget;
- :mod:`levers.tune.trial`: one A/B as data, and the rule for "it paid";
- :mod:`levers.tune.measure`: the A/B itself, through ab's design and runner;
- :mod:`levers.tune.run`: the pieces composed (what :meth:`levers.Step.tune` calls);
- :mod:`levers.tune.result`, :mod:`levers.tune.render`: the answer, and its terminal view.

tune composes ab: it never times anything itself.
"""
