"""What the zero-code script runner does by default, and which verbs take a script: read by the
runner (:mod:`levers.integrations.script`), by the command line's help, which must not import the
runner (it imports torch), and by the audit, which must not import ``levers.tune`` (tune imports
the audit)."""

# a script's first optimizer steps pay for compilation, allocator growth and data workers
SCRIPT_WARMUP = 2
SCRIPT_TIMED = 0

# `levers tune -- python train.py` runs each A/B as one run of the script (levers.tune.script);
# the audit reads this before it prints that command as a next step
TUNE_TAKES_SCRIPTS = True
# the optimizer steps each run of `levers tune -- python train.py` reaches with tune's default
# design (levers.tune.script.ScriptDesign().steps_per_run, which a test keeps equal to this): the
# audit prints a tune command that runs the script that far, and tune's help says it
TUNE_SCRIPT_STEPS = 54
