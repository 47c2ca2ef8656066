"""loss-valid-rows on a Hugging Face masked LM: the output projection gets the tokens with a
target only, the loss and the gradients stay the unchanged step's, and the undo puts the model
back. (Its contract on thirty masked-LM architectures of transformers' registry was checked with
bench/arch_sweep.py's code; tests/zoo/test_arch_levers.py keeps deberta-v2's in CI.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.levers.lever import Target  # noqa: E402
from levers.levers.loss_valid_rows import (  # noqa: E402
    IGNORE_INDEX,
    _labels_of,
    bucket,
    padded_rows,
)


def _bert():
    torch.manual_seed(0)
    return levers.Step("zoo", params={"model": "bert"}).workload()


def _trained(lever: bool, steps: int = 3):
    """Losses, the projection's input shapes and the parameters after ``steps`` steps."""
    workload = _bert()
    handle = levers.apply(workload, ["loss-valid-rows"]) if lever else None
    shapes: list[tuple[int, ...]] = []
    hook = workload.model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: shapes.append(tuple(args[0].shape)))
    losses = [float(workload.step()) for _ in range(steps)]
    hook.remove()
    params = [p.detach().clone() for p in workload.model.parameters()]
    return workload, handle, losses, shapes, params


def test_the_projection_takes_the_rows_with_a_target_and_training_is_unchanged():
    _, _, plain_losses, plain_shapes, plain_params = _trained(lever=False)
    workload, handle, losses, shapes, params = _trained(lever=True)
    batch, tokens, width = plain_shapes[0]
    assert all(shape == (batch, tokens, width) for shape in plain_shapes)
    # the zoo's masked-LM batches mask ~15% of the tokens: far fewer rows reach the projection
    for shape in shapes:
        assert shape[0] == 1 and shape[2] == width and 0 < shape[1] < batch * tokens / 2
    assert losses == pytest.approx(plain_losses, rel=1e-5)
    for before, after in zip(plain_params, params):
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    handle.undo()
    assert "forward" not in vars(workload.model)
    assert not workload.model.get_output_embeddings()._forward_pre_hooks


def test_the_logits_are_the_target_rows_in_order_then_padding():
    workload = _bert()
    model = workload.model
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 3], labels[1, 0], labels[1, 9] = 5, 7, 11
    def forward(**inputs):  # the same dropout masks on every call (training mode)
        torch.manual_seed(1)
        return model(**inputs)

    full = forward(input_ids=ids, labels=labels)
    handle = load_all()["loss-valid-rows"].patch(Target(model=model))
    try:
        sparse = forward(input_ids=ids, labels=labels)
        without_labels = forward(input_ids=ids)
        model.eval()  # an evaluation (a Trainer's metrics read every token's logits): untouched
        evaluated = model(input_ids=ids, labels=labels)
        model.train()
    finally:
        handle()
    model.eval()
    torch.testing.assert_close(evaluated.logits, model(input_ids=ids, labels=labels).logits)
    # 32 tokens pad the 3 rows with a target to a multiple of 8 with the first token's row
    assert sparse.logits.shape == (1, 8, model.config.vocab_size)
    torch.testing.assert_close(sparse.logits[0, :3], full.logits[labels != IGNORE_INDEX])
    torch.testing.assert_close(sparse.logits[0, 3:], full.logits[0, :1].expand(5, -1))
    torch.testing.assert_close(sparse.loss, full.loss)
    assert without_labels.logits.shape == full.logits.shape  # no labels: nothing changes


def test_a_projection_not_called_per_token_is_an_error_that_says_what_to_do():
    workload = _bert()
    model = workload.model
    head = model.get_output_embeddings()
    handle = load_all()["loss-valid-rows"].patch(Target(model=model))
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 0] = 1
    # a head that projects something other than each token once (here: each row's first token)
    hook = head.register_forward_pre_hook(lambda module, args: (args[0][:, :1],), prepend=True)
    try:
        with pytest.raises(RuntimeError, match="got 2 rows where the labels have 16 tokens"):
            model(input_ids=ids, labels=labels)
    finally:
        hook.remove()
        handle()


def test_it_refuses_what_is_neither_a_causal_nor_a_masked_lm():
    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

    reason = load_all()["loss-valid-rows"].applies(Target(model=Plain()))
    assert "as a masked LM" in reason and "gather the rows with a real target" in reason


def test_a_head_that_never_calls_its_projection_is_refused_or_named():
    """MobileBERT's head multiplies by its projection's weight and never calls it: applies
    refuses it; and where a forward runs with the lever on and the projection is not called,
    the error says so, not the loss's shape mismatch."""
    from transformers import BertConfig, BertForMaskedLM, MobileBertConfig, MobileBertForMaskedLM

    small = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32)
    lever = load_all()["loss-valid-rows"]
    mobile = MobileBertForMaskedLM(MobileBertConfig(**small, embedding_size=16,
                                                    intra_bottleneck_size=32,
                                                    true_hidden_size=32))
    assert "does not call its projection" in lever.applies(Target(model=mobile))

    model = BertForMaskedLM(BertConfig(**small))
    handle = lever.patch(Target(model=model))
    head = model.get_output_embeddings()
    # the projection skipped: its holder multiplies by the weight instead
    model.cls.predictions.forward = lambda hidden: hidden @ head.weight.T  # noqa: E731
    ids = torch.randint(0, 64, (2, 8))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 0] = 1
    try:
        with pytest.raises(RuntimeError, match="output projection was not called"):
            model(input_ids=ids, labels=labels)
    finally:
        del model.cls.predictions.forward
        handle()


def test_the_rows_taken_are_padded_to_a_few_sizes_the_loss_never_sees():
    # 1024 tokens: the rows are padded to a multiple of 16, never past the tokens
    assert [bucket(n) for n in (16, 512, 1024, 16384, 100_000)] == [8, 8, 16, 256, 2048]
    targets = torch.full((1024,), IGNORE_INDEX)
    sizes = set()
    for real in range(33, 50):
        targets[:] = IGNORE_INDEX
        targets[torch.randperm(1024)[:real]] = 3
        rows, count = padded_rows(targets)
        labels = _labels_of(targets, rows, count)
        sizes.add(rows.numel())
        assert count == real and rows.numel() % 16 == 0
        assert torch.equal(rows[:real], (targets != IGNORE_INDEX).nonzero().squeeze(1))
        assert (labels[:real] == 3).all() and (labels[real:] == IGNORE_INDEX).all()
    assert sizes == {48, 64}  # 17 counts of rows, two shapes
    every = torch.zeros(10, dtype=torch.long)  # every row a target: nothing to pad
    assert padded_rows(every)[0].tolist() == list(range(10))


def test_an_error_of_the_model_before_its_head_is_raised_as_it_is():
    # the model's own check of its inputs fails before the head: its error, not the lever's
    workload = _bert()
    model = workload.model
    handle = load_all()["loss-valid-rows"].patch(Target(model=model))
    labels = torch.full((2, 8), IGNORE_INDEX)
    labels[:, 0] = 1
    try:
        with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
            model(labels=labels)
    finally:
        handle()


def test_the_wrapped_forward_keeps_the_model_s_signature():
    # a Hugging Face Trainer keeps the dataset's columns the forward's signature names
    import inspect

    model = _bert().model
    before = inspect.signature(model.forward)
    handle = load_all()["loss-valid-rows"].patch(Target(model=model))
    try:
        assert "forward" in vars(model)
        assert inspect.signature(model.forward) == before
        assert "input_ids" in inspect.signature(model.forward).parameters
    finally:
        handle()


def _xlm_step(model, ids, labels, steps: int = 2):
    """Losses and gradients of ``steps`` forward-backward passes (no optimizer: the same weights)."""
    losses, grads = [], []
    for _ in range(steps):
        model.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    return losses, grads


def test_a_masked_lm_of_the_mapping_not_named_for_masked_lm_takes_its_rows():
    """XLM's masked LM is XLMWithLMHeadModel (in transformers' masked-LM mapping), whose
    prediction layer takes an unshifted cross-entropy of every token: its projection gets the
    tokens with a target only, and the loss and the gradients are the unchanged model's."""
    from transformers import XLMConfig, XLMWithLMHeadModel

    torch.manual_seed(0)
    model = XLMWithLMHeadModel(XLMConfig(vocab_size=97, emb_dim=32, n_layers=2, n_heads=2,
                                         dropout=0.0, attention_dropout=0.0))
    model.train()
    ids = torch.randint(0, 97, (3, 20))
    labels = torch.full_like(ids, IGNORE_INDEX)
    chosen = torch.rand(ids.shape) < 0.2
    chosen[0, 0] = True  # at least one target
    labels[chosen] = ids[chosen]
    plain_losses, plain_grads = _xlm_step(model, ids, labels)
    handle = levers.apply(model, ["loss-valid-rows"])
    seen: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(args[0].shape[:-1].numel()))
    losses, grads = _xlm_step(model, ids, labels)
    hook.remove()
    real = int(chosen.sum())
    assert seen and all(real <= rows < ids.numel() for rows in seen)
    assert losses == pytest.approx(plain_losses, rel=1e-5)
    for before, after in zip(plain_grads[-1], grads[-1]):
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-6)
    handle.undo()
    assert "forward" not in vars(model)


def test_an_encoder_decoder_of_the_masked_lm_mapping_is_refused_with_why():
    """BART is in transformers' masked-LM mapping, but it makes its decoder's inputs from the
    labels: the lever refuses it and says so."""
    from transformers import BartConfig, BartForConditionalGeneration

    model = BartForConditionalGeneration(BartConfig(
        vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32))
    reason = load_all()["loss-valid-rows"].applies(Target(model=model))
    assert reason is not None and "encoder-decoder" in reason
