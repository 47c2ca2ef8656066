"""The numbers of an A/B design (its steps, resamples and seed), declared once: the key the user
writes (``levers ab --steps``, a pre-registration's ``[design]``, :meth:`levers.Step.ab`'s
keywords, the fields of tune's :class:`levers.tune.measure.TrialDesign`), the
:class:`levers.ab.runner.AbConfig` field it sets (the name the JSON record keeps:
``num_steps``), and its default.

A leaf module: ``levers ab --help`` prints the defaults without importing torch.
"""

from __future__ import annotations

# design key: (AbConfig field, default)
DESIGN_FIELDS: dict[str, tuple[str, int]] = {
    "steps": ("num_steps", 50),  # timed steps per side, alternating baseline and candidate
    "warmup": ("num_warmup", 5),  # steps per side after the parity gate, not timed
    "parity_steps": ("num_parity_steps", 3),  # steps the parity gate compares (0 skips it)
    "resamples": ("num_resamples", 10_000),  # paired bootstrap resamples per CI95
    "seed": ("seed", 0),  # the workloads', the parity reseeding's and the bootstrap's
}
# the defaults by design key, and by AbConfig field
DEFAULTS_BY_KEY = {key: default for key, (_, default) in DESIGN_FIELDS.items()}
DEFAULTS_BY_FIELD = {field: default for field, default in DESIGN_FIELDS.values()}
# how an A/B's two sides run (AbConfig.sides, levers ab --sides), the default first; a run
# option, not a design key: it changes how the sides are timed, not what is compared
SIDES = ("together", "one-at-a-time")
