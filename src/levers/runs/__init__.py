"""A training run's tools: compare two runs' metrics (:mod:`compare`), pre-register a run
(:mod:`prereg`), guard it while it trains (:mod:`guards`, :mod:`windowed_peak`) and check a
resume (:mod:`resume`). Read :mod:`levers.ab`'s statistics and records; ``ab`` never imports them."""
