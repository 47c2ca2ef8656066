"""A plain GPU training script of a decoder LLM, as a user writes one: a Hugging Face model built
from its config, a DataLoader with workers, bf16 autocast, fused AdamW, gradient clipping, a
warm-up-then-cosine schedule, a log line every 20 steps. levers tune runs it unchanged
(``levers tune --budget 5m -- python bench/train_decoder.py``); ``--peer`` applies a peer's
technique by hand and ``--levers`` levers' stack, so that bench/script_goal.py times all of them
in the same script.

    python bench/train_decoder.py --steps 200 [--arch gpt_neox] [--peer compile-model]
        [--levers compile-model] [--times FILE]

``--times FILE`` writes the seconds of each optimizer step after the first 10 (from the end of
one ``optimizer.step()`` to the end of the next, the GPU synchronized at each) and the tokens of a
step, as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import transformers
from torch.utils.data import DataLoader, Dataset

SHAPES = {  # width, layers, heads, vocabulary
    "gpt_neox": dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=16,
                     intermediate_size=8192, vocab_size=50432),
    "llama": dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=16,
                  intermediate_size=5632, vocab_size=32000),
}
SKIP_STEPS = 10  # steps not timed by --times (compile, the loader's first batches)


class RandomTokens(Dataset):
    """Token sequences drawn from a generator seeded by the index: the same data every run."""

    def __init__(self, vocab: int, seq_len: int, size: int = 100_000) -> None:
        self.vocab, self.seq_len, self.size = vocab, seq_len, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(index)
        return torch.randint(0, self.vocab, (self.seq_len,), generator=g)


def schedule(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def peer(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """A peer's technique, as its users write it."""
    if name == "compile-model":
        model.compile()
    elif name == "compile-model-ro":
        model.compile(mode="reduce-overhead")
    elif name == "compile-layers":
        for layer in model.base_model.layers:
            layer.compile()
    elif name != "none":
        raise SystemExit(f"unknown peer {name}")
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="gpt_neox", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--width", type=int, default=None, help="a smaller model (a CPU smoke run)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--peer", default="none")
    parser.add_argument("--levers", default="")
    parser.add_argument("--times", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = dict(SHAPES[args.arch])
    if args.width:
        shape.update(hidden_size=args.width, intermediate_size=4 * args.width,
                     num_attention_heads=4, vocab_size=1024)
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    config = transformers.AutoConfig.for_model(
        args.arch, max_position_embeddings=args.seq_len, **shape
    )
    model = transformers.AutoModelForCausalLM.from_config(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                                  fused=device == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: schedule(step, 20, args.steps)
    )
    loader = DataLoader(
        RandomTokens(config.vocab_size, args.seq_len), batch_size=args.batch_size,
        shuffle=True, generator=torch.Generator().manual_seed(0), num_workers=2,
        pin_memory=device == "cuda", drop_last=True,
    )
    model = peer(model, args.peer)
    graphs = args.peer == "compile-model-ro"
    handle = None
    if args.levers:
        import levers

        handle = levers.apply(model, args.levers, optimizer=optimizer)
        graphs = graphs or "compile-model" in args.levers
    times: list[float] = []
    last = time.perf_counter()
    for step, ids in enumerate(loader):
        if step >= args.steps:
            break
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        ids = ids.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if args.times:
            if device == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            if step >= SKIP_STEPS:
                times.append(now - last)
            last = now
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}",
                  flush=True)
    if handle is not None:
        handle.undo()
    if args.times:
        with open(args.times, "w") as out:
            json.dump({"step_s": times, "tokens_per_step": args.batch_size * args.seq_len,
                       "peer": args.peer, "levers": args.levers}, out)


if __name__ == "__main__":
    main()
