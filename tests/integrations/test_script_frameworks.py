"""``levers audit -- python ...`` on a Hugging Face Trainer script and a Lightning script.

Each runs in its own process, as a user runs it. Skipped (visibly) where accelerate or Lightning
is not installed; the ``test`` extra installs both.
"""

from __future__ import annotations

import json

from tests.integrations.conftest import SCRIPTS, line_of, needs, receipts_by_code, run_levers

TRAINER = SCRIPTS / "train_trainer.py"
LIGHTNING = SCRIPTS / "train_lightning.py"


@needs("accelerate")
@needs("transformers")
def test_audit_of_a_trainer_script(tmp_path):
    findings, capture = tmp_path / "findings.json", tmp_path / "capture.json"
    result = run_levers("audit", "--findings-json", str(findings), "--json", str(capture), "--",
                        "python", str(TRAINER), "--max-steps", "10",
                        "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    receipts = receipts_by_code(findings)
    # the script's own loss function and dataset, at their lines
    assert ("train_trainer.py", line_of(TRAINER, "return F.cross_entropy(shift_logits")) in (
        receipts["LOSS001"]
    )
    # the dataset's reads of host tensors (a DataLoader fetch) wait for no GPU: not a sync
    dataset_line = line_of(TRAINER, "ids = torch.randint(0, self.vocab_size")
    assert ("train_trainer.py", dataset_line) not in receipts.get("SYNC001", set())
    assert ("modeling_llama.py", line_of_module("transformers.models.llama.modeling_llama",
                                                "variance = hidden_states.pow(2)")) in (
        receipts["NORM001"]
    )
    data = json.loads(capture.read_text())
    assert data["modules"][""] == "LlamaForCausalLM"
    assert {"forward", "backward", "optimizer"} <= {op["phase"] for op in data["ops"]}
    assert "training finished" not in result.stdout  # stopped after the captured step
    # the Trainer builds the optimizer: the stack is applied through it, not levers.apply(model)
    assert data["settings"]["script_names"]["framework"] == "transformers"
    assert "apply them to your Trainer: Trainer(..., callbacks=[LeversCallback(levers=" in (
        result.stdout
    )
    assert "levers.apply(model" not in result.stdout


def line_of_module(module: str, text: str) -> int:
    import importlib.util
    from pathlib import Path

    return line_of(Path(importlib.util.find_spec(module).origin), text)


@needs("accelerate")
@needs("transformers")
def test_a_trainer_script_that_raises_keeps_its_exit_code(tmp_path):
    result = run_levers("audit", "--", "python", str(TRAINER), "--size", "nonesuch")
    assert result.returncode == 2  # argparse's invalid choice
    assert "invalid choice: 'nonesuch'" in result.stderr
    assert "levers saw no optimizer step" in result.stderr.splitlines()[-1]


@needs("lightning_fabric")
def test_audit_of_a_lightning_script(tmp_path):
    findings, capture = tmp_path / "findings.json", tmp_path / "capture.json"
    result = run_levers("audit", "--findings-json", str(findings), "--json", str(capture), "--",
                        "python", str(LIGHTNING), "--max-steps", "10",
                        "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    # the LightningModule prints in training_step: steps 0, 1 (warm-up), 2 (recorded) and 3
    # (timed)
    printed = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in printed] == ["0", "1", "2", "3"]
    assert receipts_by_code(findings) == {
        "ATTN002": {("train_lightning.py", line_of(LIGHTNING, "attn = (q @ k.transpose"))},
        "MEM001": {("train_lightning.py", line_of(LIGHTNING, "x = x + self.attn(self.norm1(x))"))},
        "SYNC001": {("train_lightning.py", line_of(LIGHTNING, "loss {loss.item()"))},
    }
    data = json.loads(capture.read_text())
    # Lightning runs forward and backward inside optimizer.step(closure): still labelled so
    by_phase = {}
    for op in data["ops"]:
        by_phase.setdefault(op["phase"], []).append(op)
    assert by_phase["forward"][0]["index"] < by_phase["backward"][0]["index"]
    model_ops = ("convolution", "bmm", "_softmax", "native_layer_norm", "addmm")
    for phase in ("forward", "backward"):
        assert any(any(m in op["name"] for m in model_ops) for op in by_phase[phase])
    assert not any(any(m in op["name"] for m in model_ops) for op in by_phase["optimizer"])
