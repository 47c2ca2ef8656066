"""Text models from transformers that the built-in workloads do not cover, for
bench/memory_accuracy.py.

``gpt2``: transformers' GPT-2 (its ``Conv1D`` layers are ``addmm`` with a bias, so every linear
has a bias gradient, and it uses SDPA attention), built from a config with random weights,
trained under bf16 autocast with a fused AdamW on the GPU. ``size="medium8"`` is GPT-2 medium's
width (1024, 16 heads) with 8 layers at batch 8 x seq 1024; ``size="tiny"`` runs on a CPU in a
second. bench/capture_overhead.py times the same model.
"""

from __future__ import annotations

import torch

from levers import Workload

SIZES = {
    "medium8": {"n_layer": 8, "n_embd": 1024, "n_head": 16, "vocab": 50257, "seq": 1024},
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab": 512, "seq": 32},
}


def gpt2(device="cpu", batch_size=8, size="medium8", seed=0, seq_len=None) -> Workload:
    """``seq_len`` (default: the size's) also sets the model's positions."""
    import transformers

    shape = dict(SIZES[size], **({"seq": int(seq_len)} if seq_len is not None else {}))
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=shape["n_layer"], n_embd=shape["n_embd"], n_head=shape["n_head"],
        n_positions=shape["seq"], vocab_size=shape["vocab"], use_cache=False,
        bos_token_id=shape["vocab"] - 1, eos_token_id=shape["vocab"] - 1,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = model.to(device).train()
    on_cuda = torch.device(device).type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=on_cuda or None)
    ids = torch.randint(0, shape["vocab"], (int(batch_size), shape["seq"]), device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_cuda):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return Workload(
        model=model, step=step, optimizer=optimizer, name=f"gpt2-{size}",
        tokens_per_step=int(batch_size) * shape["seq"],
        params={"batch_size": batch_size, "size": size, "seq_len": shape["seq"]},
    )
