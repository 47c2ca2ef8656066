"""The recommended stack holds only levers that apply to the captured model (defect N1): its
``levers ab`` command and ``levers.apply`` line run as printed."""

from __future__ import annotations

from pathlib import Path

import pytest

import levers
from levers.audit.recommend import recommend
from levers.levers.applicability import recorded


@pytest.mark.parametrize("model", ["nanogpt", "gpt2", "resnet"])
def test_every_lever_of_the_recommended_stack_applies_to_the_model(model):
    step = levers.Step("zoo", params={"model": model})
    audited = step.audit(memory_model=False)
    answers = recorded(step.capture())
    assert answers is not None and set(answers) == set(levers.levers.load_all())
    stack = audited.report.recommendation.levers
    handle = levers.apply(step.workload(), list(stack))  # raises NotApplicable otherwise
    handle.undo()


# attention written out by hand, in two blocks (ATTN002 fires; no switch for sdpa-attention)
HAND_WRITTEN = str(Path(__file__).parent / "rules" / "ATTN002" / "cases.py") + ":regress_two_blocks"


def test_hand_written_attention_is_a_code_change_not_a_lever():
    step = levers.Step(HAND_WRITTEN)
    audited = step.audit(memory_model=False)
    rec = audited.report.recommendation
    assert "sdpa-attention" not in rec.levers and rec.command is None  # nothing to prove
    assert any(
        note.startswith("ATTN002: sdpa-attention left out: it does not apply to this model")
        for note in rec.notes
    )
    assert "sdpa-attention" in rec.inapplicable
    from levers.audit.report_format import lever_text

    attn = next(f for f in audited.findings if f.code == "ATTN002")
    assert lever_text(attn, rec.inapplicable) == (
        "a code change: sdpa-attention does not apply to this model"
    )


def test_a_capture_without_answers_recommends_as_before():
    step = levers.Step(HAND_WRITTEN)
    audited = step.audit(memory_model=False)
    capture = step.capture()
    import dataclasses

    bare = dataclasses.replace(
        capture, settings={k: v for k, v in capture.settings.items() if k != "levers"}
    )
    result = audited.result
    rec = recommend(audited.findings, bare, step_ms=result.step_ms, weight=1.0)
    assert "sdpa-attention" in rec.levers and rec.inapplicable == {}


def test_two_findings_that_leave_a_lever_out_for_one_reason_say_it_once():
    # timm's levit writes attention out in two classes: two ATTN002 findings, one note
    import dataclasses

    step = levers.Step(HAND_WRITTEN)
    audited = step.audit(memory_model=False)
    attn = next(f for f in audited.findings if f.code == "ATTN002")
    other = dataclasses.replace(attn.receipts[0], line=attn.receipts[0].line + 10)
    twice = [attn, dataclasses.replace(attn, receipts=(other,))]
    rec = recommend(twice, step.capture(), step_ms=audited.result.step_ms, weight=1.0)
    notes = [n for n in rec.notes if n.startswith("ATTN002: sdpa-attention left out")]
    assert len(notes) == 1
