"""What the capture does to keep its host cost per op down, and that it changes nothing: the
dynamo guard on the recorder only where compiled code can reach it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import fixture_models
import torch

from levers.capture import capture_step
from levers.capture.recorder import OpRecorder, UnguardedOpRecorder, make_recorder
from levers.workload import Workload


def _run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_without_compiled_code_the_recorder_skips_the_dynamo_guard():
    # a fresh process: nothing compiled, so no compiled frame can reach the handler
    assert _run_python(
        """
        import torch
        from levers.capture.recorder import make_recorder
        print(type(make_recorder(torch.nn.Linear(2, 2), live=None)).__name__)
        """
    ) == "UnguardedOpRecorder"


def test_after_torch_compile_the_recorder_keeps_the_guard_and_captures_the_compiled_step():
    out = _run_python(
        """
        import torch
        from levers.capture import capture_step
        from levers.capture.recorder import make_recorder
        from levers.workload import Workload

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        compiled = torch.compile(model, backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 8)

        def step():
            loss = compiled(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        workload = Workload(model=model, step=step, optimizer=opt, name="compiled")
        capture = capture_step(workload, warmup=1, timed=0)
        kind = type(make_recorder(model, live=None)).__name__
        names = [op.name for op in capture.ops]
        print(kind, "aten.addmm.default" in names, len(names) > 5)
        """
    )
    assert out == "OpRecorder True True"


def test_both_recorders_record_the_same_ops():
    def names_with(cls) -> list[tuple]:
        import levers.capture.step as step_module

        saved = step_module.make_recorder
        step_module.make_recorder = lambda model, guarded=False, **kw: cls(model, **kw)
        try:
            capture = capture_step(fixture_models.linear(), warmup=1, timed=0)
        finally:
            step_module.make_recorder = saved
        return [(op.name, op.phase, op.module, op.forward_op) for op in capture.ops]

    assert names_with(OpRecorder) == names_with(UnguardedOpRecorder)
    assert UnguardedOpRecorder.__torch_dispatch__ is OpRecorder._dispatch
    assert OpRecorder.__torch_dispatch__ is not OpRecorder._dispatch  # torch's guard


def test_a_step_that_has_not_run_yet_is_captured_with_the_guard():
    # it may compile during the capture, so compiled frames could reach the recorder
    from levers.capture.step import StepCapture

    for ran_before, expected in ((False, OpRecorder), (True, UnguardedOpRecorder)):
        capture = StepCapture(fixture_models.linear(), ran_before=ran_before)
        capture.start()
        try:
            kind = type(capture.recorder)
        finally:
            capture.abort()
        if expected is UnguardedOpRecorder and kind is OpRecorder:
            continue  # this test process compiled something earlier: guarded either way
        assert kind is expected


def test_make_recorder_passes_its_arguments():
    model = torch.nn.Linear(2, 2)
    recorder = make_recorder(model, live=None)
    assert isinstance(recorder, OpRecorder) and recorder.live is None


def test_op_records_built_without_their_init_equal_those_built_with_it():
    # build_ops fills each frozen OpRecord's fields directly (frozen_record): every field, no other
    from dataclasses import fields

    from levers.capture.records import OpRecord

    names = {f.name for f in fields(OpRecord)}
    capture = capture_step(fixture_models.linear(), warmup=1, timed=0)
    for op in capture.ops:
        assert set(vars(op)) == names
        rebuilt = OpRecord(**{name: getattr(op, name) for name in names})
        assert rebuilt == op and hash(rebuilt) == hash(op)


def test_tensor_keys_give_what_meta_of_gives():
    from levers.capture.ops import MetaCache, meta_of, meta_of_key, nbytes, tensor_key

    tensors = [torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(()),
               torch.empty(4, device="meta"), torch.ones(()).expand(5), torch.ones(4, 4).t()]
    for t in tensors:
        assert meta_of_key(tensor_key(t)) == (meta_of(t), nbytes(t))
    assert MetaCache().of_keys([tensor_key(t) for t in tensors]) == MetaCache().of_all(tensors)


def test_list_arguments_are_walked_where_the_schema_lets_them_hold_tensors():
    from levers.capture.ops import lists_may_hold_tensors

    aten = torch.ops.aten
    for func in (aten.cat.default, aten.stack.default, aten.index.Tensor,
                 aten.index_put_.default, aten._foreach_add_.List):
        assert lists_may_hold_tensors(func), func
    for func in (aten.view.default, aten.sum.dim_IntList, aten.permute.default, aten.mm.default,
                 aten.split_with_sizes.default):
        assert not lists_may_hold_tensors(func), func
