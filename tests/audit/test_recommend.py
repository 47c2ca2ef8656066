"""The recommended stack: levers in rank order, clashes and covered levers left out, implemented
levers preferred, and the `levers ab` command with the workload as given."""

from __future__ import annotations

import pytest

from levers.audit.finding import Cost, Finding, Receipt
from levers.audit.recommend import recommend
from levers.capture.records import Capture, MemoryStats, StepTiming


def _finding(code, levers, saved_ms, **details):
    return Finding(
        code=code, name="x", message="", fix_title="", receipts=(Receipt("f.py", 1, ""),),
        severity="medium", effort="S", risk="low", lever=levers[0],
        cost=Cost("estimated", now_ms=saved_ms, fixed_ms=0.0),
        details={"levers": list(levers), **details},
    )


CAPTURE = Capture(
    schema_version=1, workload="hf-llama-1b", workload_params={}, tokens_per_step=None, env={},
    provenance={}, timing=StepTiming((), 0.1), memory=MemoryStats("tracked", 0, 1 << 30, 0),
    ops=(), calls=(),
)


def _stack(findings, implemented=frozenset()):
    return recommend(
        findings, CAPTURE, step_ms=100.0, weight=0.0, workload_spec="hf",
        set_items=["size=1b"], implemented=implemented,
    )


def test_compile_covers_the_fused_kernel_levers_and_clashes_with_liger():
    rec = _stack([
        _finding("ELEM001", ("compile-blocks", "liger-kernels"), 50),
        _finding("LOSS002", ("fused-linear-cross-entropy",), 10),
        _finding("NORM001", ("rms-norm-fused", "compile-blocks"), 8),
        _finding("FUSE002", ("liger-kernels", "compile-blocks"), 5),
    ])
    assert rec.levers == ("compile-blocks", "fused-linear-cross-entropy")
    assert rec.codes == ("ELEM001", "LOSS002")
    assert rec.missing == rec.levers
    assert rec.command == "levers ab hf --set size=1b --lever compile-blocks,fused-linear-cross-entropy"


def test_liger_first_then_compile_clashes():
    rec = _stack([
        _finding("FUSE002", ("liger-kernels",), 30),
        _finding("ELEM001", ("compile-blocks",), 20),
    ])
    assert rec.levers == ("liger-kernels",)
    assert "clashes with liger-kernels" in rec.notes[0]


def test_not_recommended_and_no_payoff_are_left_out_and_implemented_preferred():
    rec = _stack(
        [
            _finding("MEM001", ("ac-full",), 0, recommended=False),
            _finding("PAD001", ("packing", "padding-free", "pad-to-multiple"), 0),
            _finding("NORM001", ("rms-norm-fused", "compile-blocks"), 8),
        ],
        implemented=frozenset({"compile-blocks"}),
    )
    assert rec.levers == ("compile-blocks",) and rec.missing == ()


def test_padding_worth_removing_recommends_packing_where_the_step_exposes_batches():
    import dataclasses

    from levers.audit.rules.pad001_padding_tokens import LEVERS

    padded = dataclasses.replace(CAPTURE, settings={"batches": "padded"})
    rec = recommend(
        [_finding("PAD001", LEVERS, 30)], padded, step_ms=100.0, weight=0.0,
        workload_spec="hf", set_items=["lengths=longtail"],
    )
    assert rec.levers == ("packing",) and rec.missing == ()
    assert rec.command == "levers ab hf --set lengths=longtail --lever packing"
    # a step without batches to change (a script, a Trainer): no levers ab command that would
    # refuse, but how to apply it
    rec = recommend(
        [_finding("PAD001", LEVERS, 30), _finding("NORM001", ("rms-norm-fused",), 8)], CAPTURE,
        step_ms=100.0, weight=0.0, workload_spec="demo",
    )
    assert rec.levers == ("rms-norm-fused",)
    (note,) = rec.notes
    assert note.startswith("PAD001: packing left out") and 'levers.apply(trainer, "packing")' in note


def test_empty_stack_has_no_command():
    assert _stack([]).command is None


def test_on_a_cpu_levers_that_need_a_cuda_device_are_left_out_and_said_why():
    findings = [
        _finding("MEM003", ("raise-batch",), 60),
        _finding("FUSE002", ("liger-kernels",), 30),
        _finding("NORM001", ("rms-norm-fused",), 8),
    ]
    everything = frozenset({"raise-batch", "liger-kernels", "rms-norm-fused"})
    rec = recommend(
        findings, CAPTURE, step_ms=100.0, weight=0.0, workload_spec="demo",
        implemented=everything, on_gpu=False, gpu="h100-80gb",
    )
    assert rec.levers == ("rms-norm-fused",)
    assert rec.command == "levers ab demo --lever rms-norm-fused"
    assert any("raise-batch left out: it needs a CUDA GPU" in note for note in rec.notes)
    # a command that runs as printed, on this machine
    assert any("levers memory demo --gpu h100-80gb --fit batch_size" in note for note in rec.notes)
    assert any("liger-kernels left out: it needs a CUDA GPU" in note for note in rec.notes)
    on_gpu = recommend(
        findings, CAPTURE, step_ms=100.0, weight=0.0, workload_spec="demo", implemented=everything,
    )
    assert on_gpu.levers == ("raise-batch", "liger-kernels", "rms-norm-fused")


SCRIPT_CAPTURE = Capture(
    schema_version=1, workload="plain_train.py",
    workload_params={"command": "python plain_train.py --steps 9"}, tokens_per_step=None,
    env={}, provenance={}, timing=StepTiming((), 0.1), memory=MemoryStats("tracked", 0, 1, 0),
    ops=(), calls=(),
)


def test_a_script_gets_no_levers_ab_of_itself_but_what_works(monkeypatch):
    import levers.audit.recommend as recommend_mod

    monkeypatch.setattr(recommend_mod, "tune_takes_scripts", lambda: False)
    findings = [_finding("NORM001", ("rms-norm-fused",), 8), _finding("COPY001", ("inplace-scatter",), 4)]
    rec = recommend(findings, SCRIPT_CAPTURE, step_ms=100.0, weight=0.0, implemented=frozenset())
    assert rec.levers == ("rms-norm-fused", "inplace-scatter")
    assert rec.command is None  # `levers ab plain_train.py` would run the script's training
    text = "\n".join(rec.next_steps)
    assert 'levers.apply(model, "rms-norm-fused,inplace-scatter", optimizer=optimizer)' in text
    assert "README.md, section Workloads" in text
    assert "levers ab path/to/file.py:factory --lever rms-norm-fused,inplace-scatter" in text
    assert "levers tune" not in text
    monkeypatch.setattr(recommend_mod, "tune_takes_scripts", lambda: True)
    rec = recommend(findings, SCRIPT_CAPTURE, step_ms=100.0, weight=0.0, implemented=frozenset())
    # the command runs as printed: levers tune runs the script to its optimizer step 54 (defect
    # N4: `--steps 9` as the audit ran it ended before that and tune refused it)
    assert rec.next_steps[-1].endswith(
        "levers tune -- python plain_train.py --steps 54 (--steps 9 raised to 54: each of its "
        "A/Bs runs the script to its optimizer step 54)"
    )


@pytest.mark.parametrize("command, tune, note", [
    ("python train.py --steps 6 --lr 3e-4", "python train.py --steps 54 --lr 3e-4", "raised"),
    ("python train.py --max_steps=8", "python train.py --max_steps=54", "raised"),
    ("python -m pkg.train --max-iters 10", "python -m pkg.train --max-iters 54", "raised"),
    ("python train.py --steps 200", "python train.py --steps 200", ""),
    ("python nanogpt.py 10", "python nanogpt.py 10", "at least"),  # no option says its steps
    ("python train.py --warmup-steps 5", "python train.py --warmup-steps 5", "at least"),
    ("python train.py --name 'my run'", "python train.py --name 'my run'", "at least"),
])
def test_the_printed_tune_command_runs_the_script_long_enough(command, tune, note):
    from levers.audit.script_step import tune_script_command

    printed, said = tune_script_command(command)
    assert printed == f"levers tune -- {tune}"
    if note == "raised":
        assert said.endswith("raised to 54: each of its A/Bs runs the script to its optimizer step 54")
    elif note:
        assert said == ("each of its A/Bs runs the script to its optimizer step 54: let the "
                        "script run at least that many")
    else:
        assert said == ""



# -- the rules' own findings put their levers in the stack (issue 22: a place for each lever) --


def _rule_stack(code, case):
    from audit_helpers import captured, run_rule

    from levers.audit.rank import MEMORY_WEIGHT

    capture, _ = captured(code, case)
    return recommend(
        run_rule(code, case), capture, step_ms=100.0, weight=MEMORY_WEIGHT,
        workload_spec="case", on_gpu=False,
    )


def test_mem004_where_memory_binds_stacks_bf16_state_not_8bit():
    rec = _rule_stack("MEM004", "fire_adamw_memory_bound")
    assert rec.levers == ("adamw-bf16-state",) and rec.codes == ("MEM004",)
    assert rec.missing == () and rec.notes == ()


def test_mem004_without_a_bound_memory_stacks_nothing():
    assert _rule_stack("MEM004", "fire_adamw").levers == ()
    assert _rule_stack("MEM004", "regress_throughput_bound").levers == ()


def test_moe001_on_transformers_experts_stacks_grouped_mm_and_on_hand_written_ones_nothing():
    rec = _rule_stack("MOE001", "regress_hf_mixtral_eager")
    assert rec.levers == ("experts-grouped-mm",) and rec.codes == ("MOE001",)
    assert _rule_stack("MOE001", "fire_experts_loop").levers == ()


def _with_names(**names):
    import dataclasses

    found = {"model": None, "optimizer": None, "model_class": "TinyLM", "optimizer_class": "AdamW",
             "framework": None, "trainer": None, **names}
    return dataclasses.replace(SCRIPT_CAPTURE, settings={"script_names": found})


def test_a_script_apply_line_uses_the_script_names():
    findings = [_finding("NORM001", ("rms-norm-fused",), 8)]
    capture = _with_names(model="net", optimizer="opt")
    rec = recommend(findings, capture, step_ms=100.0, weight=0.0, implemented=frozenset())
    assert rec.next_steps[0] == (
        'apply them in your script: with levers.apply(net, "rms-norm-fused", optimizer=opt): '
        "(the loop runs inside; undone on exit)"
    )


def test_a_trainer_script_is_told_to_apply_through_the_trainer():
    findings = [_finding("NORM001", ("rms-norm-fused",), 8)]
    capture = _with_names(model="trainer.model", framework="transformers", trainer="trainer")
    rec = recommend(findings, capture, step_ms=100.0, weight=0.0, implemented=frozenset())
    assert rec.next_steps[0].startswith(
        'apply them to your Trainer: Trainer(..., callbacks=[LeversCallback(levers="rms-norm-fused")])'
    )
    assert "levers.apply(" not in rec.next_steps[0]
