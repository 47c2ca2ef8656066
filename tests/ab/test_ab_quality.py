"""The quality read of levers ab: held-out per-example losses, paired between the sides."""

from __future__ import annotations

import torch
from ab_helpers import FACTORIES

from levers.ab.runner import AbConfig, Side, run_ab
from levers.ab.verdict import DAMAGED, NOT_MEASURED, PARITY
from levers.loader import load_workload

FAST = dict(num_steps=3, num_warmup=1, num_parity_steps=1, num_resamples=200)


def with_eval_hook(shift: float = 0.0, **params):
    """The tiny factory's workload with a held-out set of 8 examples; ``shift`` plants damage."""

    def build():
        workload = load_workload(f"{FACTORIES}:build", params)
        generator = torch.Generator().manual_seed(123)
        x = torch.randn(8, 16, generator=generator)
        y = torch.randn(8, 1, generator=generator)

        def eval_losses():
            return (workload.model(x) - y).pow(2).squeeze(1) + shift

        workload.eval_losses = eval_losses
        return workload

    return Side(build, "eval-hooked", params)


def test_identical_sides_read_parity_with_a_point_ci_at_zero(clock):
    result = run_ab(with_eval_hook(clock=clock), with_eval_hook(clock=clock), AbConfig(**FAST))
    q = result.quality
    assert q.verdict == PARITY and q.num_examples == 8
    assert (q.ci.difference, q.ci.lo, q.ci.hi) == (0.0, 0.0, 0.0)


def test_a_candidate_with_worse_held_out_loss_is_damaged(clock):
    result = run_ab(
        with_eval_hook(clock=clock), with_eval_hook(shift=0.5, clock=clock), AbConfig(**FAST)
    )
    assert result.quality.verdict == DAMAGED
    assert result.quality.ci.lo > 0.49
    assert result.decision == DAMAGED


def test_without_the_hook_the_read_is_skipped_with_a_note(clock):
    plain = Side(lambda: load_workload(f"{FACTORIES}:build", {"clock": clock}), "plain", {})
    result = run_ab(with_eval_hook(clock=clock), plain, AbConfig(**FAST))
    assert result.quality.verdict == NOT_MEASURED
    assert "the candidate workload sets no eval_losses hook" in result.quality.note


def test_an_exact_candidate_skips_the_read(clock):
    result = run_ab(
        with_eval_hook(clock=clock), with_eval_hook(clock=clock), AbConfig(**FAST, exactness="exact")
    )
    assert result.quality.verdict == NOT_MEASURED and "declared exact" in result.quality.note
