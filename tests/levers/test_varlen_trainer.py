"""The data levers on a Hugging Face Trainer's collator and a DataLoader's collate_fn: the
training loss of a packed or flattened step equals the padded one, and the undo puts the
original collator back."""

from __future__ import annotations

import pytest
import torch

import levers
from levers.batches import longtail_lengths, padded
from levers.levers.lever import NotApplicable

transformers = pytest.importorskip("transformers")
from levers.workloads import hf  # noqa: E402

LENGTHS = longtail_lengths(8, 64, seed=1)


class Sequences(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(1, 500, (LENGTHS[i],), generator=g)}


def pad_features(features):
    return padded([f["input_ids"] for f in features])


def trainer(tmp_path, name):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / name), max_steps=1, per_device_train_batch_size=8,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", seed=0,
        dataloader_drop_last=False,
    )
    return transformers.Trainer(
        model=hf.build(seed=0).model, args=args, train_dataset=Sequences(),
        data_collator=pad_features,
    )


@pytest.mark.slow
@pytest.mark.parametrize("lever_id", ["packing", "padding-free"])
def test_a_trainers_packed_step_has_the_padded_training_loss(tmp_path, lever_id):
    base = trainer(tmp_path, "base").train().training_loss
    t = trainer(tmp_path, lever_id)
    handle = levers.apply(t, lever_id)
    batch = t.data_collator([Sequences()[i] for i in range(8)])
    assert "attention_mask" not in batch and "position_ids" in batch
    assert t.train().training_loss == pytest.approx(base, rel=1e-5)
    handle.undo()
    assert t.data_collator is pad_features


@pytest.mark.slow
def test_the_callback_packs_the_training_dataloader_for_the_run(tmp_path):
    from levers.integrations.transformers import LeversCallback

    base = trainer(tmp_path, "base").train().training_loss
    t = trainer(tmp_path, "callback")
    callback = LeversCallback(levers="packing")
    t.add_callback(callback)
    seen = []
    t.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(sorted(kwargs)), with_kwargs=True
    )
    assert t.train().training_loss == pytest.approx(base, rel=1e-5)
    assert "position_ids" in seen[0] and "attention_mask" not in seen[0]
    assert callback.applied is None  # undone when training ended


def test_a_dataloader_collate_fn_is_wrapped_and_restored():
    model = hf.build(seed=0).model
    loader = torch.utils.data.DataLoader(Sequences(), batch_size=8, collate_fn=pad_features)
    with levers.apply(model, "padding-free", data=loader):
        (batch,) = list(loader)
        assert batch["input_ids"].shape == (1, sum(LENGTHS))
    assert loader.collate_fn is pad_features
    with pytest.raises(NotApplicable, match="not a Hugging Face transformers model"):
        levers.apply(torch.nn.Linear(2, 2), "packing", data=loader)
    assert loader.collate_fn is pad_features  # refused: nothing left wrapped


def test_a_flattening_collator_is_already_padding_free(tmp_path):
    t = trainer(tmp_path, "flat")
    t.data_collator = transformers.DataCollatorWithFlattening()
    with pytest.raises(NotApplicable, match="already laid out without padding"):
        levers.apply(t, "packing")
