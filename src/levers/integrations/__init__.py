"""levers inside training code people already have: the zero-code script runner
(``levers audit -- python train.py``), an in-loop capture, and Trainer / Lightning callbacks."""
