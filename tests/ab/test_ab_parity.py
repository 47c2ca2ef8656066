"""The parity gate's parts: gradient norms from inside the step, tolerances, comparisons."""

from __future__ import annotations

import math

import pytest
import torch
from ab_helpers import side

from levers import Workload
from levers.ab.gradnorm import grad_norm_probe
from levers.ab.killlines import KillLines
from levers.ab.parity import RTOL, is_low_precision, rel_diff, run_parity, tolerance_for


def _linear_workload(
    seed: int = 0, *, accumulate: int = 1, rename: bool = False, scale: float = 1.0
) -> Workload:
    """A two-layer linear model's SGD step; ``scale`` multiplies its loss (so its gradients): a
    drift of ``scale - 1`` from the unscaled step."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    if rename:
        model = torch.nn.ModuleDict({"only": model})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(8.0).reshape(2, 4) / 8
    net = model["only"] if rename else model

    def step():
        for _ in range(accumulate):
            loss = net(x).square().mean() * scale
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return Workload(model=model, step=step, optimizer=opt)


def _expected_grad_norm(seed: int = 0, accumulate: int = 1) -> float:
    w = _linear_workload(seed)
    for _ in range(accumulate):
        w.model(torch.arange(8.0).reshape(2, 4) / 8).square().mean().backward()
    return math.sqrt(sum(float(p.grad.square().sum()) for p in w.model.parameters()))


@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_probe_sees_the_final_gradients_of_a_step(accumulate):
    workload = _linear_workload(accumulate=accumulate)
    with grad_norm_probe(workload.model) as take:
        workload.step()  # zero_grad inside: the grads are gone by now
        norm = take()
    assert float(norm) == pytest.approx(_expected_grad_norm(accumulate=accumulate), rel=1e-6)
    assert all(p.grad is None for p in workload.model.parameters())


def test_the_probe_skips_a_gradient_a_compiled_backward_leaves_undefined():
    # a parameter that only picks indices (DeepSeek's sparse-attention indexer: top-k) gets no
    # gradient; eager never calls its hooks, a compiled backward calls them with grad None
    # (axk2, hy_v4, deepseek_v4 under compile-blocks in the CPU arch sweep raised here)
    class Picker(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.value, self.score = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.value(x).gather(-1, self.score(x).topk(2, dim=-1).indices)

    torch.manual_seed(0)
    eager, compiled = Picker(), Picker()
    compiled.load_state_dict(eager.state_dict())
    compiled.compile(backend="aot_eager")
    x = torch.randn(2, 4)
    norms = []
    for model in (eager, compiled):
        with grad_norm_probe(model) as take:
            model(x).sum().backward()
            norms.append(float(take()))
    assert compiled.score.weight.grad is None
    assert norms[1] == pytest.approx(norms[0], rel=1e-6)


def test_the_probe_resets_and_removes_its_hooks(monkeypatch):
    workload = _linear_workload()
    with grad_norm_probe(workload.model) as take:
        assert take() is None
        workload.step()
        assert take() is not None
        assert take() is None
    calls = []
    norm = torch.linalg.vector_norm
    monkeypatch.setattr(
        torch.linalg, "vector_norm", lambda *a, **k: calls.append(1) or norm(*a, **k)
    )
    workload.step()  # hooks removed: the step computes no norm any more
    assert calls == []


def test_tolerances_depend_on_exactness_and_precision():
    assert RTOL[("exact", False)] < RTOL[("changes-numerics", False)]
    assert RTOL[("changes-numerics", False)] < RTOL[("changes-numerics", True)]
    tol = tolerance_for("exact", True)
    assert (tol.rtol_first, tol.rtol_last) == RTOL[("exact", True)]
    with pytest.raises(ValueError, match="exactness"):
        tolerance_for("approximately", False)


def test_low_precision_from_the_dtype_parameter_or_the_weights():
    w = _linear_workload()
    assert is_low_precision(w) is False
    w.params = {"dtype": "bf16"}
    assert is_low_precision(w) is True
    w.params = {"dtype": torch.float16}
    assert is_low_precision(w) is True
    w.params = {}
    w.model.to(torch.bfloat16)
    assert is_low_precision(w) is True


def test_rel_diff():
    assert rel_diff(2.0, 2.0) == 0.0
    assert rel_diff(1.0, 2.0) == 0.5
    assert rel_diff(0.0, 0.0) == 0.0
    assert rel_diff(1.0, float("nan")) == math.inf
    assert rel_diff(float("inf"), float("inf")) == 0.0


def test_params_are_not_compared_when_the_models_name_them_differently():
    lines = KillLines()
    result, kill = run_parity(
        _linear_workload(),
        _linear_workload(rename=True),
        num_steps=2,
        exactness="exact",
        seed=0,
        lines=lines,
    )
    assert kill is None and result.passed is True
    assert "params" not in [c.quantity for c in result.checks]
    assert result.notes == (
        "parameters not compared: the two models name or shape them differently",
    )


def test_parameters_gate_only_when_the_change_is_declared_exact():
    exact, _ = run_parity(
        _linear_workload(0),
        _linear_workload(0),
        num_steps=2,
        exactness="exact",
        seed=0,
        lines=KillLines(),
    )
    changing, _ = run_parity(
        _linear_workload(0),
        _linear_workload(0),
        num_steps=2,
        exactness="changes-numerics",
        seed=0,
        lines=KillLines(),
    )
    assert [c.gating for c in exact.checks if c.quantity == "params"] == [True]
    assert [c.gating for c in changing.checks if c.quantity == "params"] == [False]


def test_a_wrong_fix_fails_under_either_declaration():
    for exactness in ("exact", "changes-numerics"):
        base, cand = side(), side(fixed="scaled_loss")
        result, kill = run_parity(
            base.build(), cand.build(), num_steps=3, exactness=exactness, seed=0, lines=KillLines()
        )
        assert kill is None
        assert result.passed is False
        assert [(c.step, c.quantity, c.passed) for c in result.checks[:4]] == [
            (1, "loss", False),
            (1, "grad_norm", False),
            (3, "loss", False),
            (3, "grad_norm", False),
        ]


def test_a_correct_rewrite_is_not_exact_but_passes_as_numerics_changing():
    base, cand = side(), side(fixed="rewrite")
    result, _ = run_parity(
        base.build(),
        cand.build(),
        num_steps=3,
        exactness="changes-numerics",
        seed=0,
        lines=KillLines(),
    )
    assert result.passed is True
    assert result.tolerance.rtol_first == RTOL[("changes-numerics", False)][0]


def test_autocast_inside_the_step_selects_low_precision_tolerances():
    def autocast_workload() -> Workload:
        workload = _linear_workload()
        plain_step = workload.step

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return plain_step()

        workload.step = step
        return workload

    plain, _ = run_parity(
        _linear_workload(),
        _linear_workload(),
        num_steps=1,
        exactness="changes-numerics",
        seed=0,
        lines=KillLines(),
    )
    mixed, _ = run_parity(
        autocast_workload(),
        autocast_workload(),
        num_steps=1,
        exactness="changes-numerics",
        seed=0,
        lines=KillLines(),
    )
    assert (plain.tolerance.low_precision, plain.tolerance.autocast) == (False, None)
    assert (mixed.tolerance.low_precision, mixed.tolerance.autocast) == (True, "bfloat16")
    assert mixed.tolerance.rtol_first == RTOL[("changes-numerics", True)][0]


def test_autocast_is_read_from_each_side_even_when_the_two_models_share_a_module():
    """transformers' XLM holds one module-level GELU that every XLM model calls: a hook on it
    fires in the other side's step too. Found by bench/arch_sweep.py: autocast-bf16 on xlm was
    judged at fp32's tolerance (DAMAGED) because the candidate's probe first fired, on the
    shared GELU, inside the baseline's fp32 step."""
    shared = torch.nn.GELU()

    def workload(autocast: bool) -> Workload:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), shared, torch.nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.arange(8.0).reshape(2, 4) / 8

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(x).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return Workload(model=model, step=step, optimizer=opt)

    result, _ = run_parity(
        workload(autocast=False),
        workload(autocast=True),
        num_steps=1,
        exactness="changes-numerics",
        seed=0,
        lines=KillLines(),
    )
    assert (result.tolerance.low_precision, result.tolerance.autocast) == (True, "bfloat16")


def test_the_parity_note_names_the_first_failing_check_in_step_order():
    # The later check differs by strictly more: a note naming the largest difference would name
    # it, a note naming the first failure in step order names the loss after step 1. No tie.
    from levers.ab.parity import ParityCheck, ParityResult, Tolerance
    from levers.ab.reads import parity_read

    tol = Tolerance("changes-numerics", False, 1e-4, 1e-3)
    checks = (
        ParityCheck(1, "loss", 1.0, 1.5, 1 / 3, 1e-4, False, True),
        ParityCheck(1, "grad_norm", 2.0, 2.0, 0.0, 1e-4, True, True),
        ParityCheck(3, "loss", 1.0, 1.5, 1 / 3, 1e-3, False, True),
        ParityCheck(3, "grad_norm", 1.0, 4.0, 0.75, 1e-3, False, True),
    )
    parity = ParityResult(False, 3, tol, checks, (), (), (), ())
    note = parity_read(parity).note
    assert note.startswith("loss after step 1 differs by 0.333 (tolerance 0.0001")
    assert "2 more checks failed" in note


def test_a_lever_declared_floor_raises_the_tolerance_and_the_note_names_it():
    def judged(floor):
        result, _ = run_parity(
            _linear_workload(), _linear_workload(scale=1.03), num_steps=2,
            exactness="changes-numerics", seed=0, lines=KillLines(), floor=floor, floor_of="float8",
        )
        return result

    # a drift of 3% fails fp32's 1e-4 and passes a floor of 5% (float8's)
    assert judged(None).passed is False
    floored = judged(0.05)
    assert floored.passed is True
    assert (floored.tolerance.rtol_first, floored.tolerance.rtol_last) == (0.05, 0.05)
    assert (floored.tolerance.floor, floored.tolerance.floor_of) == (0.05, "float8")
    # and a drift past the floor still fails
    assert run_parity(
        _linear_workload(), _linear_workload(scale=1.2), num_steps=2, exactness="changes-numerics",
        seed=0, lines=KillLines(), floor=0.05, floor_of="float8",
    )[0].passed is False


def test_a_floor_never_loosens_an_exact_candidate_nor_lowers_the_table():
    assert tolerance_for("exact", True, floor=0.05).rtol_last == RTOL[("exact", True)][1]
    low = tolerance_for("changes-numerics", True, floor=1e-3, floor_of="some-lever")
    assert (low.rtol_first, low.rtol_last, low.floor) == (*RTOL[("changes-numerics", True)], None)


def test_the_design_takes_the_floor_its_levers_declare():
    from levers.ab import design as design_mod

    def config_of(levers_named):
        given = {"baseline": "demo", "params": {"size": "tiny"}, "levers": levers_named}
        resolved, _ = design_mod.resolve(given, {}, None)
        return design_mod.config(resolved, {}, "changes-numerics")

    floored = config_of(["compile-blocks", "float8"])
    assert (floored.parity_floor, floored.parity_floor_of) == (0.05, "float8")
    assert config_of(["compile-blocks"]).parity_floor is None
