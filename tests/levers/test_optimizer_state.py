"""The optimizer-state levers (adamw-bf16-state, adamw-8bit): why not, the state they keep (dtype
and bytes), numerics against fp32 AdamW, and an undo that gives the optimizer back exactly.

torchao compiles its update once per parameter shape (tens of seconds each on a 2-core CPU), so
the tests run it eagerly (``eager``: ``torch.compile`` returns the function); the same function
runs, unfused. One slow test runs the compiled update."""

from __future__ import annotations

import json
import sys
import types
import warnings

import pytest
import torch
from torch import nn

import levers
from levers.capture.env import _optimizer_info
from levers.levers import REGISTRY, adamw_8bit, adamw_bf16_state, load_all
from levers.levers._optimizer_state import MARK, MEASURED_ON_GPU, park, state_nbytes
from levers.levers.lever import NotApplicable, Target
from levers.tune.candidates import MEMORY_FORMS, candidates, exclusive_with
from levers.vocab import CHANGES_NUMERICS
from levers.workloads import llama

load_all()
IDS = ("adamw-bf16-state", "adamw-8bit")
MODULES = {"adamw-bf16-state": adamw_bf16_state, "adamw-8bit": adamw_8bit}


def needs_torchao():
    return pytest.importorskip("torchao.optim", reason="torchao not installed")


@pytest.fixture
def eager(monkeypatch):
    """torchao's update run eagerly (torchao calls torch.compile at each step)."""
    needs_torchao()
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def train(workload, num_steps: int = 3) -> torch.Tensor:
    return torch.stack([torch.as_tensor(workload.step()).detach() for _ in range(num_steps)])


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def fp32_moment_bytes(model: nn.Module) -> int:
    return sum(2 * 4 * p.numel() for p in model.parameters())


# -- the catalogue ------------------------------------------------------------------------


def test_both_are_registered_as_numerics_changing_memory_forms_for_tune():
    for lever_id in IDS:
        lever = REGISTRY[lever_id]
        assert lever.safety == CHANGES_NUMERICS and lever.tolerance == 1e-3
        assert lever.runs_on_cpu and lever.needs_gpu  # the saving is read on a GPU
        assert "500 steps" in MODULES[lever_id].__doc__
    assert frozenset(IDS) in MEMORY_FORMS
    assert exclusive_with("adamw-8bit", ["compile-blocks", "adamw-bf16-state"]) == (
        "adamw-bf16-state"
    )


class _OnCuda(nn.Module):
    """A model whose parameters say they live on CUDA (only their device is read)."""

    def parameters(self, recurse: bool = True):
        yield types.SimpleNamespace(device=torch.device("cuda"))


@pytest.mark.parametrize("lever_id", IDS)
@pytest.mark.parametrize(
    "flags, how",
    [({"fused": True}, "fused"), ({}, "multi-tensor (foreach)"), ({"foreach": True}, "multi-tensor")],
)
def test_against_a_multi_tensor_adamw_on_a_gpu_tune_leaves_it_out_as_a_memory_lever(
    lever_id, flags, how
):
    optimizer = torch.optim.AdamW([nn.Parameter(torch.ones(4))], **flags)
    why = REGISTRY[lever_id].slower_here(Target(model=_OnCuda(), optimizer=optimizer))
    assert why is not None and how in why and "a memory lever" in why
    assert MEASURED_ON_GPU[lever_id] in why
    ordered, skipped = candidates(
        {lever_id: REGISTRY[lever_id]}, lambda lever: None, on_gpu=True,
        slower_of=lambda lever: lever.slower_here(Target(model=_OnCuda(), optimizer=optimizer)),
    )
    assert ordered == [] and [s.lever for s in skipped] == [lever_id]
    assert why in skipped[0].reason


@pytest.mark.parametrize("lever_id", IDS)
def test_against_a_per_tensor_loop_or_off_cuda_it_stays_a_candidate(lever_id):
    loop = torch.optim.AdamW([nn.Parameter(torch.ones(4))], foreach=False)
    assert REGISTRY[lever_id].slower_here(Target(model=_OnCuda(), optimizer=loop)) is None
    fused = torch.optim.AdamW([nn.Parameter(torch.ones(4))], fused=True)
    on_cpu = nn.Linear(2, 2)
    assert REGISTRY[lever_id].slower_here(Target(model=on_cpu, optimizer=fused)) is None
    assert REGISTRY[lever_id].slower_here(Target(model=_OnCuda(), optimizer=None)) is None


# -- why not ------------------------------------------------------------------------------


@pytest.mark.parametrize("lever_id", IDS)
def test_an_optimizer_other_than_adam_is_refused_with_what_to_do(lever_id):
    model = nn.Linear(64, 64)
    with pytest.raises(NotApplicable) as caught:
        levers.apply(model, lever_id, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert str(caught.value) == (
        f"lever {lever_id} does not apply: SGD is not torch.optim.Adam or AdamW: these levers "
        "keep Adam's two moments smaller; train with torch.optim.AdamW to use them, or keep this "
        "optimizer's state as it is"
    )
    with pytest.raises(NotApplicable, match="no optimizer given"):
        levers.apply(model, lever_id)


@pytest.mark.parametrize("lever_id", IDS)
def test_without_torchao_it_says_how_to_install_it(lever_id, monkeypatch):
    for name in ("torchao", "torchao.optim", "torchao.optim.adam"):
        monkeypatch.setitem(sys.modules, name, None)
    model = nn.Linear(64, 64)
    with pytest.raises(NotApplicable) as caught:
        levers.apply(model, lever_id, optimizer=torch.optim.AdamW(model.parameters()))
    assert str(caught.value).endswith(
        "torchao is not installed (pip install torchao, or pip install 'levers[optim]')"
    )


@pytest.mark.parametrize("lever_id", IDS)
def test_amsgrad_and_a_second_state_lever_are_refused(lever_id, eager):
    model = nn.Linear(64, 64)
    amsgrad = torch.optim.AdamW(model.parameters(), amsgrad=True)
    with pytest.raises(NotApplicable, match="amsgrad=True keeps a third moment"):
        levers.apply(model, lever_id, optimizer=amsgrad)
    optimizer = torch.optim.AdamW(model.parameters())
    with levers.apply(model, lever_id, optimizer=optimizer):
        for other in IDS:
            with pytest.raises(NotApplicable, match=f"already kept by {lever_id}: one optimizer"):
                levers.apply(model, other, optimizer=optimizer)


def test_bf16_state_refuses_bf16_parameters_and_8bit_refuses_small_ones(eager):
    model = nn.Linear(64, 64).to(torch.bfloat16)
    with pytest.raises(NotApplicable, match="its parameters are bfloat16, so Adam's state is"):
        levers.apply(model, "adamw-bf16-state", optimizer=torch.optim.AdamW(model.parameters()))
    small = nn.Linear(32, 32)  # 1024 weights: torchao keeps their moments in fp32
    with pytest.raises(NotApplicable, match="no parameter has 4096 elements or more"):
        levers.apply(small, "adamw-8bit", optimizer=torch.optim.AdamW(small.parameters()))


# -- the state it keeps -------------------------------------------------------------------


def test_bf16_state_keeps_bf16_moments_at_half_the_bytes(eager):
    on = llama.build()
    optimizer = on.optimizer
    levers.apply(on, "adamw-bf16-state")
    train(on, 1)
    for p in on.model.parameters():
        state = optimizer.state[p]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
        assert state["exp_avg"].shape == p.shape
    assert state_nbytes(optimizer, moments_only=True) == fp32_moment_bytes(on.model) // 2
    baseline = llama.build()
    train(baseline, 1)
    assert 2 * state_nbytes(optimizer, moments_only=True) == state_nbytes(
        baseline.optimizer, moments_only=True
    )


def test_8bit_keeps_uint8_codes_for_the_large_parameters_and_fp32_for_the_rest(eager):
    ao = needs_torchao()
    on = llama.build()
    optimizer = on.optimizer
    levers.apply(on, "adamw-8bit")
    train(on, 1)
    expected = 0
    for p in on.model.parameters():
        state = optimizer.state[p]
        if adamw_8bit.quantized(p):
            for key in ("exp_avg", "exp_avg_sq"):
                moment = state[key]
                assert isinstance(moment, ao.subclass_8bit.OptimState8bit)
                assert moment.codes.dtype == torch.uint8 and moment.codes.shape == p.shape
                assert moment.scale.numel() == p.numel() // 256
            # codes, one fp32 scale per 256 values, and a 256-entry fp32 map, per moment
            expected += 2 * (p.numel() + 4 * p.numel() // 256 + 4 * 256)
        else:  # the norm weights (64 values)
            assert state["exp_avg"].dtype == torch.float32
            expected += 2 * 4 * p.numel()
    assert state_nbytes(optimizer, moments_only=True) == expected
    share = expected / fp32_moment_bytes(on.model)
    assert 0.25 < share < 0.30  # about a quarter
    # a capture's state_bytes counts the codes, not the fp32 the subclass poses as
    assert _optimizer_info(optimizer)["state_bytes"] == state_nbytes(optimizer)


@pytest.mark.parametrize("lever_id", IDS)
def test_trains_within_its_tolerance_of_fp32_adamw(lever_id, eager):
    initial = params_of(llama.build().model)
    baseline = llama.build()
    expected = train(baseline)
    on = llama.build()
    levers.apply(on, lever_id)
    losses = train(on)
    assert relative(losses, expected) <= REGISTRY[lever_id].tolerance
    reference = params_of(baseline.model)
    # its update ran, not fp32 AdamW's: the parameters moved otherwise (the losses of three steps
    # at this learning rate can agree to the last bit)
    moved = [name for name, p in on.model.named_parameters()
             if not torch.equal(p.detach(), reference[name])]
    assert moved
    for name, p in on.model.named_parameters():
        update, wanted = p.detach() - initial[name], reference[name] - initial[name]
        assert relative(update, wanted) <= MODULES[lever_id].UPDATE_RTOL, name


def test_adam_with_l2_decay_gets_torchaos_adam_and_adamw_its_adamw(eager):
    ao = needs_torchao()
    model = nn.Linear(64, 64)
    for cls, decoupled in ((torch.optim.Adam, False), (torch.optim.AdamW, True)):
        optimizer = cls(model.parameters())
        with levers.apply(model, "adamw-8bit", optimizer=optimizer):
            inner = optimizer.step.inner
            assert type(inner) is (ao.adam.AdamW8bit if decoupled else ao.adam.Adam8bit)
        optimizer = cls(model.parameters())
        with levers.apply(model, "adamw-bf16-state", optimizer=optimizer):
            assert optimizer.step.inner.is_adamw is decoupled


# -- hyper-parameters and LR schedulers ---------------------------------------------------


@pytest.mark.parametrize("lever_id", IDS)
def test_the_current_hyperparameters_are_read_at_each_step_and_schedulers_keep_working(
    lever_id, eager
):
    torch.manual_seed(0)
    model = nn.Linear(64, 128)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.9), eps=1e-6,
                                  weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scheduler_step = optimizer.step  # the scheduler's wrapper, an instance attribute
    groups = [dict(g) for g in optimizer.param_groups]
    handle = levers.apply(model, lever_id, optimizer=optimizer)
    inner = optimizer.step.inner
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # LRScheduler warns when optimizer.step looks overridden
        for _ in range(2):
            model(torch.randn(8, 64)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
    (group,) = inner.param_groups
    assert float(group["lr"]) == pytest.approx(1e-3 * 0.5)  # the lr of the second step
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.9), 1e-6, 0.05)
    handle.undo()
    assert optimizer.step is scheduler_step
    assert [{k: v for k, v in g.items() if k != "lr"} for g in optimizer.param_groups] == [
        {k: v for k, v in g.items() if k != "lr"} for g in groups
    ]
    assert optimizer.param_groups[0]["params"][0] is model.weight


# -- undo ---------------------------------------------------------------------------------


@pytest.mark.parametrize("lever_id", IDS)
def test_undo_gives_back_the_same_optimizer_and_training_goes_on_bitwise(lever_id, eager):
    expected = train(llama.build(), 2)
    on = llama.build()
    optimizer, state = on.optimizer, on.optimizer.state
    attributes = set(vars(optimizer))
    handle = levers.apply(on, lever_id)
    assert optimizer.state is not state and getattr(optimizer, MARK) == lever_id
    handle.undo()
    assert optimizer.state is state and not state
    assert set(vars(optimizer)) == attributes  # no step, _opt_called or mark left behind
    assert on.optimizer is optimizer
    assert torch.equal(train(on, 2), expected)


@pytest.mark.parametrize("lever_id", IDS)
def test_an_optimizer_that_stepped_seeds_the_lever_and_gets_its_own_state_back(lever_id, eager):
    on = llama.build()
    optimizer = on.optimizer
    train(on, 1)
    state = optimizer.state
    tensors = {p: dict(s) for p, s in state.items()}
    values = {p: {k: v.clone() for k, v in s.items()} for p, s in state.items()}
    handle = levers.apply(on, lever_id)
    weight = on.model.lm_head.weight
    seeded = optimizer.state[weight]
    assert float(seeded["step"]) == 1.0
    moment = seeded["exp_avg"]
    moment = moment.dequantize() if hasattr(moment, "dequantize") else moment.float()
    assert relative(moment, values[weight]["exp_avg"]) < 0.05
    train(on, 2)
    assert float(optimizer.state[weight]["step"]) == 3.0
    handle.undo()
    assert optimizer.state is state
    for p, s in state.items():
        for key, value in s.items():
            assert value is tensors[p][key] and torch.equal(value, values[p][key]), key


def test_parked_state_frees_its_storage_and_comes_back_bitwise():
    tensor = torch.randn(1000)
    before = tensor.clone()
    state = {"p": {"exp_avg": tensor, "step": torch.tensor(3.0)}}
    refill = park(state)  # a CPU tensor: nothing to free
    assert tensor.untyped_storage().nbytes() == 4000
    refill()
    refill = park(state, on_cpu_too=True)
    assert tensor.untyped_storage().nbytes() == 0
    refill()
    assert state["p"]["exp_avg"] is tensor and torch.equal(tensor, before)


# -- compiled, as on a GPU ----------------------------------------------------------------


@pytest.mark.slow
def test_the_compiled_bf16_update_matches_the_eager_one_in_dtype_and_closely_in_value():
    needs_torchao()
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(128, 64, bias=False)
        batches = torch.randn(2, 8, 128)  # drawn first: inductor's RNG seeds from the global one
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with pytest.MonkeyPatch.context() as patch:
            if not compiled:
                patch.setattr(torch, "compile", lambda fn, **kwargs: fn)
            levers.apply(model, "adamw-bf16-state", optimizer=optimizer)
            for batch in batches:
                model(batch).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        assert optimizer.state[model.weight]["exp_avg"].dtype == torch.bfloat16
        results.append(model.weight.detach().clone())
    assert relative(results[1], results[0]) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("lever_id", IDS)
def test_on_a_gpu_the_fp32_state_is_parked_while_the_lever_is_on(lever_id):
    needs_torchao()
    on = llama.build(device="cuda")
    optimizer = on.optimizer
    train(on, 1)
    fp32 = state_nbytes(optimizer)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    handle = levers.apply(on, lever_id)
    train(on, 2)
    torch.cuda.synchronize()
    new = state_nbytes(optimizer)  # its step counters are on the host, as torchao keeps them
    assert new < fp32 * (0.55 if lever_id == "adamw-bf16-state" else 0.35)
    # the fp32 state parked on the host, the lever's allocated: within the allocator's rounding
    assert abs(torch.cuda.memory_allocated() - before - (new - fp32)) < 2**16
    handle.undo()
    assert state_nbytes(optimizer) == fp32
    train(on, 1)


# -- where they are listed and tried ------------------------------------------------------


def test_levers_list_shows_both_unmeasured_by_an_empty_catalogue_and_the_finding_they_fix(
    capsys, tmp_path
):
    from levers.cli import main

    empty = tmp_path / "catalogue.json"
    empty.write_text('{"rows": []}')
    assert main(["list", "--json", "--catalogue", str(empty)]) == 0
    listed = {item["id"]: item for item in json.loads(capsys.readouterr().out)["levers"]}
    for lever_id in IDS:
        assert listed[lever_id]["measured"] == [] and listed[lever_id]["fixes"] == ["MEM004"]


def test_tune_leaves_them_out_on_a_cpu_and_tries_them_as_one_group_on_a_gpu():
    from levers.tune.candidates import GPU_ONLY_PREFIX, candidates, groups

    registry = {lever_id: REGISTRY[lever_id] for lever_id in (*IDS, "ac-full")}
    tried, skipped = candidates(registry, lambda lever: None, on_gpu=False)
    assert [c.lever for c in tried] == ["ac-full"]
    assert {s.lever for s in skipped if s.reason.startswith(GPU_ONLY_PREFIX)} == set(IDS)
    tried, _ = candidates(registry, lambda lever: None, on_gpu=True)
    assert sorted(sorted(c.lever for c in g) for g in groups(tried)) == [
        ["ac-full"], ["adamw-8bit", "adamw-bf16-state"]
    ]
