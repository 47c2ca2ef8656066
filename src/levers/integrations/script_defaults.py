"""How many of a script's steps the zero-code runner lets pass and times, by default: read by the
runner (:mod:`levers.integrations.script`) and by the command line's help, which must not import
the runner (it imports torch)."""

# a script's first optimizer steps pay for compilation, allocator growth and data workers
SCRIPT_WARMUP = 2
SCRIPT_TIMED = 0
