"""Resume checks: a reused seed, misplaced fused-optimizer step tensors, counters, the banner."""

from __future__ import annotations

import pytest
import torch

from levers.runs import resume
from levers.runs.guards import RunGuard
from levers.ab.record import read_record


def _trained_adamw(fused: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def _planted_cpu_steps_on_device_params():
    """Fused AdamW over parameters on another device whose step tensors stayed on the CPU.

    This is the state a loader leaves when it writes ``optimizer.state`` directly from a
    CPU-tagged checkpoint. 'meta' stands in for the GPU: it is a device other than the CPU that
    every build of torch has.
    """
    params = [torch.nn.Parameter(torch.zeros(3, device="meta")) for _ in range(2)]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    for p in params:
        opt.state[p] = {
            "step": torch.tensor(40_000.0),  # CPU
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    return params, opt


def test_load_state_dict_of_fused_adamw_leaves_step_tensors_with_their_parameters():
    model, opt = _trained_adamw()
    _, fresh = _trained_adamw()
    fresh.load_state_dict(opt.state_dict())
    assert resume.misplaced_step_tensors(fresh) == []
    assert resume.check_optimizer_step_devices(fresh).passed


def test_a_cpu_resident_fused_adamw_step_tensor_is_caught_and_rehomed():
    params, opt = _planted_cpu_steps_on_device_params()
    found = resume.misplaced_step_tensors(opt)
    assert found == [
        {"group": 0, "param": 0, "step_device": "cpu", "param_device": "meta"},
        {"group": 0, "param": 1, "step_device": "cpu", "param_device": "meta"},
    ]
    result = resume.check_optimizer_step_devices(opt)
    assert not result.passed and "rehome_step_tensors" in result.message
    assert resume.rehome_step_tensors(opt) == 2
    for p in params:
        assert opt.state[p]["step"].device.type == "meta"
        assert opt.state[p]["step"].dtype == torch.float32
    assert resume.misplaced_step_tensors(opt) == []
    assert resume.rehome_step_tensors(opt) == 0


def test_a_plain_adamw_keeps_its_cpu_step_tensors_unflagged():
    params = [torch.nn.Parameter(torch.zeros(3, device="meta"))]
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    opt.state[params[0]] = {"step": torch.tensor(3.0)}
    assert resume.misplaced_step_tensors(opt) == []  # the for-loop path wants step on the CPU


def test_the_guard_refuses_the_planted_state_and_fixes_it_when_asked(tmp_path):
    _, opt = _planted_cpu_steps_on_device_params()
    guard = RunGuard(record=tmp_path / "r.jsonl")
    with pytest.raises(resume.ResumeError, match="optimizer_step_devices"):
        guard.check_resume(optimizer=opt)
    results = guard.check_resume(optimizer=opt, fix_step_tensors=True)
    assert [r.check for r in results] == ["optimizer_step_devices"] and results[0].passed
    events = [e["event"] for e in read_record(tmp_path / "r.jsonl")]
    assert events == ["resume_check", "rehome_step_tensors", "resume_check"]


def test_a_reused_seed_is_refused_unless_a_reason_is_given():
    guard = RunGuard()
    with pytest.raises(resume.ResumeError, match="reuses the checkpoint's seed 0"):
        guard.check_resume(seed=0, checkpoint_seed=0)
    assert guard.check_resume(seed=1, checkpoint_seed=0)[0].passed
    (ok,) = guard.check_resume(seed=0, checkpoint_seed=0, seed_reuse_reason="bitwise replay test")
    assert ok.passed and "bitwise replay test" in ok.message


def test_step_lr_and_scheduler_must_match_the_checkpoint():
    model, opt = _trained_adamw(fused=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        opt.step()
        sched.step()
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()

    _, fresh = _trained_adamw(fused=False)
    fresh_sched = torch.optim.lr_scheduler.StepLR(fresh, step_size=1, gamma=0.5)
    guard = RunGuard()
    with pytest.raises(resume.ResumeError) as caught:
        guard.check_resume(
            optimizer=fresh,
            checkpoint_optimizer_state=saved_opt,
            scheduler=fresh_sched,
            checkpoint_scheduler_state=saved_sched,
            step=0,
            checkpoint_step=3,
        )
    message = str(caught.value)
    assert "[learning_rate]" in message and "[scheduler]" in message and "[step]" in message
    fresh.load_state_dict(saved_opt)
    fresh_sched.load_state_dict(saved_sched)
    results = guard.check_resume(
        optimizer=fresh,
        checkpoint_optimizer_state=saved_opt,
        scheduler=fresh_sched,
        checkpoint_scheduler_state=saved_sched,
        step=3,
        checkpoint_step=3,
    )
    assert all(r.passed for r in results) and len(results) == 4


def test_banner_lists_each_differing_count():
    result = resume.check_banner(
        {"datasets": 880, "episodes": 38_622, "frames": 18_669_180},
        {"datasets": 878, "episodes": 38_622},
    )
    assert not result.passed
    assert result.values["differ"] == {
        "datasets": {"declared": 880, "observed": 878},
        "frames": {"declared": 18_669_180, "observed": None},
    }


@pytest.mark.gpu
def test_gpu_fused_adamw_with_cpu_step_tensors_fails_then_runs_after_rehome():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = torch.nn.Linear(8, 8, device="cuda")
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    opt.step()
    for p in model.parameters():
        opt.state[p]["step"] = opt.state[p]["step"].cpu()  # what a direct-state loader leaves
    assert len(resume.misplaced_step_tensors(opt)) == 2
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    with pytest.raises(RuntimeError):
        opt.step()
    assert resume.rehome_step_tensors(opt) == 2
    opt.step()
    assert all(opt.state[p]["step"].device.type == "cuda" for p in model.parameters())
