"""One audit's options are one record, checked at the border and passed whole (issue 35)."""

from __future__ import annotations

import pytest
from hand_capture import make_capture

import levers.hardware
from levers import Step
from levers.audit.options import AuditOptions


def test_the_record_resolves_the_gpu_and_checks_every_value():
    options = AuditOptions.checked(gpu="h200", select=["ATTN"], torch_version="2.11")
    assert options.gpu is levers.hardware.GPUS["h200"]
    assert options.select == ("ATTN",) and AuditOptions().target.name == "h100-80gb"
    for given, said in [
        ({"gpu": "h900"}, "--gpu 'h900' is not known"),
        ({"torch_version": "two"}, "not of the form MAJOR.MINOR"),
        ({"assume_dtype": "fp8"}, "--assume-dtype 'fp8' is not known"),
        ({"select": ["NOPE"]}, "matches no rule code"),
    ]:
        with pytest.raises(ValueError, match=said):
            AuditOptions.checked(**given)


def test_the_gpu_name_is_looked_up_once_per_audit(monkeypatch):
    seen = []
    lookup = levers.hardware.lookup_gpu

    def counted(text):
        seen.append(text)
        return lookup(text)

    monkeypatch.setattr(levers.hardware, "lookup_gpu", counted)
    Step.from_capture(make_capture()).audit(target="a100", memory_model=False)
    assert seen == ["a100"]


def test_step_audit_takes_the_record_or_the_keywords_not_both():
    step = Step.from_capture(make_capture())
    options = AuditOptions.checked(gpu="a100", benchmark=False)
    audited = step.audit(options=options)
    assert audited.result.config.gpu is levers.hardware.GPUS["a100-80gb"]
    with pytest.raises(TypeError, match="not both"):
        step.audit(options=options, target="h100")


def test_a_bad_option_is_refused_before_the_step_is_captured(monkeypatch):
    # Step.audit read --assume-dtype when the rules ran, after the capture (a minute on a
    # large model)
    def no_capture(self):
        raise AssertionError("the step was captured before the options were checked")

    monkeypatch.setattr(Step, "_current_capture", no_capture)
    with pytest.raises(ValueError, match="--assume-dtype 'fp8' is not known"):
        Step("demo").audit(assume_dtype="fp8")
