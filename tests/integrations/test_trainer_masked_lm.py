"""loss-valid-rows on a Hugging Face Trainer's masked LM, as a user applies it to the code they
have: the training losses are the unchanged run's, and the Trainer's evaluation (its metrics
read every token's logits) runs on the model as it was."""

from __future__ import annotations

import pytest
import torch

import levers

pytest.importorskip("transformers")

VOCAB, TOKENS = 96, 16


def _data(seed: int, n: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
        labels = torch.full_like(ids, -100)
        masked = torch.rand(TOKENS, generator=generator) < 0.25  # about 4 of 16 have a target
        masked[0] = True
        labels[masked] = ids[masked]
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def _run(tmp_path, lever: bool):
    from transformers import BertConfig, BertForMaskedLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32)
    model = BertForMaskedLM(config)
    shapes = []

    def metrics(prediction):
        shapes.append(prediction.predictions.shape)  # every token's logits
        return {"tokens": float(prediction.predictions.shape[1])}

    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=str(tmp_path / f"run{int(lever)}"),
                               per_device_train_batch_size=4, per_device_eval_batch_size=4,
                               max_steps=6, report_to=[], save_strategy="no", use_cpu=True,
                               disable_tqdm=True, logging_steps=1, seed=0, data_seed=0),
        train_dataset=_data(1, 24),
        eval_dataset=_data(2, 8),
        compute_metrics=metrics,
    )
    handle = levers.apply(model, ["loss-valid-rows"]) if lever else None
    trainer.train()
    evaluated = trainer.evaluate()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if handle is not None:
        handle.undo()
    return losses, evaluated, shapes


def test_a_trainer_trains_the_same_and_evaluates_every_token(tmp_path):
    plain_losses, plain_eval, plain_shapes = _run(tmp_path, lever=False)
    losses, evaluated, shapes = _run(tmp_path, lever=True)
    assert len(losses) == 6
    assert losses == pytest.approx(plain_losses, rel=1e-4)
    assert shapes == plain_shapes == [(8, TOKENS, VOCAB)]
    assert evaluated["eval_loss"] == pytest.approx(plain_eval["eval_loss"], rel=1e-4)
