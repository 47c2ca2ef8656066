"""The apply line levers prints for a script names the model and optimizer as the script does,
and a Hugging Face Trainer script gets the callback (defect N15: it always printed
``levers.apply(model, ..., optimizer=optimizer)``, a NameError in a script whose optimizer is
``opt``, and no form a Trainer script can use)."""

from __future__ import annotations

import sys

import torch

from levers.audit.script_step import apply_call
from levers.cli import main
from levers.integrations.script_names import find_names
from tests.integrations.conftest import SCRIPTS


def test_the_audit_of_a_script_prints_its_own_names(capsys):
    code = main(["audit", "--no-memory-model", "--", "python",
                 str(SCRIPTS / "train_own_names.py"), "--steps", "6"])
    out = capsys.readouterr().out
    assert code == 0
    assert 'with levers.apply(net, "compile-blocks", optimizer=opt):' in out
    assert "levers.apply(model" not in out and "optimizer=optimizer" not in out


def _hook(model, optimizer):
    """Stands for levers' optimizer hook: called from the loop, it looks up the loop's frames
    (from its caller's: the hook's own frame is levers', not the script's)."""
    return find_names(model, optimizer, sys._getframe(1))


class Loop:
    def __init__(self):
        self.model = torch.nn.Linear(2, 2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def fit(self):
        return _hook(self.model, self.optimizer)


def test_a_variable_holding_the_object_is_its_name():
    net = torch.nn.Linear(2, 2)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    names = _hook(net, sgd)
    assert (names.model, names.optimizer, names.framework) == ("net", "sgd", None)


def test_an_attribute_holding_the_object_is_named_through_its_owner():
    names = Loop().fit()
    assert (names.model, names.optimizer) == ("self.model", "self.optimizer")


def test_a_submodule_of_a_wrapper_is_named_through_the_wrapper():
    inner = torch.nn.Linear(2, 2)
    wrapped = torch.nn.Sequential()
    wrapped.add_module("net", inner)
    optimizer = torch.optim.SGD(inner.parameters(), lr=0.1)
    del inner
    names = _hook(wrapped.net, optimizer)
    assert names.model == "wrapped.net" and names.optimizer == "optimizer"


def test_what_is_not_found_is_said_not_guessed():
    names = {"model": None, "optimizer": None, "model_class": "TinyLM", "optimizer_class": "AdamW"}
    call, missing = apply_call(names, "compile-blocks")
    assert call == 'levers.apply(model, "compile-blocks")'
    assert "model is the TinyLM the script trains" in missing
    assert "add optimizer= with the AdamW the script steps" in missing


class Trainer:
    """Stands for transformers.Trainer: the class name and module levers recognises."""

    __module__ = "transformers.trainer"

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def train(self):
        return _hook(self.model, self.optimizer)


def test_a_hugging_face_trainer_running_the_loop_is_said():
    model = torch.nn.Linear(2, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    names = trainer.train()
    assert names.framework == "transformers" and names.trainer == "trainer"
