"""``levers.capture_step`` inside a loop, and the Trainer and Lightning callbacks."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import levers
from tests.integrations.conftest import needs

REPORTS = {"audit.md", "audit.html", "capture.json", "trace.json"}


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _train_step(model, optimizer, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def test_an_empty_capture_step_block_is_an_error_not_an_empty_audit():
    """Defect N20: with capture_step(...): pass audited to no finding, with no word."""
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="no training step ran inside capture_step") as info:
        with levers.capture_step(model, optimizer):
            pass
    assert "put one step of your loop inside it" in str(info.value)


def test_a_forward_only_block_warns_that_the_audit_sees_no_step():
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="ran no backward"):
        with levers.capture_step(model, optimizer) as step:
            model(torch.randn(4, 32)).sum()
    assert step.capture is not None and step.capture.ops


def test_capture_step_captures_the_block_and_changes_no_result(tmp_path):
    torch.manual_seed(0)
    model, twin = TinyMLP(), TinyMLP()
    twin.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    for _ in range(2):
        _train_step(model, opt, x, y)
        _train_step(twin, twin_opt, x, y)
    with levers.capture_step(model, opt, name="mlp") as step:
        with pytest.raises(ValueError, match="after the with block"):
            step.audit()
        _train_step(model, opt, x, y)
    _train_step(twin, twin_opt, x, y)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)  # bitwise: the capture only observed
    capture = step.capture
    assert capture.workload == "mlp"
    assert {op.phase for op in capture.ops} == {"forward", "backward", "optimizer"}
    assert {op.module for op in capture.ops if op.name == "aten.addmm.default"} == {"fc1", "fc2"}
    audited = step.audit(select=["SYNC", "LOSS"])
    assert audited.findings == ()
    assert {a.code for a in audited.report.already_right} >= {"LOSS001"}
    written = audited.write(tmp_path / "out")
    assert set(written) == REPORTS and all(p.is_file() for p in written.values())
    assert json.loads(written["capture.json"].read_text())["audit"]["schema"] == "levers.audit/1"


def test_capture_step_that_raises_leaves_nothing_installed():
    model = TinyMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    num_hooks = len(torch.nn.modules.module._global_forward_hooks)
    with pytest.raises(RuntimeError, match="boom"):
        with levers.capture_step(model, opt):
            model(torch.randn(2, 32)).sum().backward()
            raise RuntimeError("boom")
    assert torch.utils._python_dispatch._get_current_dispatch_mode() is None
    assert len(torch.nn.modules.module._global_forward_hooks) == num_hooks


@needs("accelerate")
@needs("transformers")
def test_trainer_callback_writes_the_report_into_the_output_dir(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from levers.integrations.transformers import LeversCallback

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=128)
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (24, 16))
    data = [{"input_ids": row, "labels": row} for row in ids]
    callback = LeversCallback(step=3)
    trainer = Trainer(
        model=LlamaForCausalLM(config),
        args=TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4,
                               max_steps=5, report_to=[], save_strategy="no", use_cpu=True,
                               disable_tqdm=True, logging_steps=100),
        train_dataset=data,
        callbacks=[callback],
    )
    trainer.train()
    assert trainer.state.global_step == 5  # the run went on to its end
    directory = tmp_path / "run" / "levers"
    assert {p.name for p in directory.iterdir()} == REPORTS
    capture = json.loads((directory / "capture.json").read_text())
    assert capture["modules"][""] == "LlamaForCausalLM"
    assert {"forward", "backward", "optimizer"} <= {op["phase"] for op in capture["ops"]}
    assert "NORM001" in {f.code for f in callback.audited.findings}


@needs("lightning_fabric")
@pytest.mark.parametrize("max_steps, mode", [(4, "two-pass"), (2, "one-pass")])
def test_lightning_callback_writes_the_report_under_the_root_dir(tmp_path, max_steps, mode):
    """Step 2 is recorded and step 3 timed; a run of two steps ends before the timed step and
    gets the report of the recorded step alone."""
    from levers.integrations.lightning import LeversCallback

    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = TinyMLP()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 32), torch.randint(0, 10, (40,)))
    callback = LeversCallback(step=2)
    trainer = pl.Trainer(max_steps=max_steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path), callbacks=[callback],
                         accelerator="cpu", devices=1)
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=8))
    assert trainer.global_step == max_steps
    directory = tmp_path / "levers"
    assert {p.name for p in directory.iterdir()} == REPORTS
    capture = json.loads((directory / "capture.json").read_text())
    assert capture["passes"]["mode"] == mode
    phases = [op["phase"] for op in capture["ops"]]
    # forward and backward ran in Lightning's closure inside optimizer.step: labelled as such
    addmm = [op for op in capture["ops"] if op["name"] == "aten.addmm.default"]
    assert addmm and {op["phase"] for op in addmm} == {"forward"}
    assert {op["module"] for op in addmm} == {"net.fc1", "net.fc2"}
    assert "backward" in phases and phases[-1] == "optimizer"


def test_callback_step_must_leave_a_step_before_it():
    from levers.integrations.callbacks import StepAuditor

    with pytest.raises(ValueError, match="step must be an int >= 2"):
        StepAuditor(step=1, target=None, name="x")
