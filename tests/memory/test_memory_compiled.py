"""Compiled blocks in a prediction: one graph, partitioned as inductor partitions it, with the
target GPU's attention, saving what the block saves when compiled outside the predictor."""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils._pytree import tree_leaves

from levers.hardware import resolve_gpu
from levers.levers.handle import apply_to_workload
from levers.memory import compiled, sdpa
from levers.memory.autocast import cuda_autocast_policy
from levers.memory.composites import cuda_composites
from levers.memory.fake import _sdpa_handler
from levers.memory.prediction import run_prediction, source_of
from levers.memory.standin import DeviceBook

H200 = resolve_gpu("h200")
SPECS = {
    "llama": ("llama", {"size": "tiny"}, "blocks."),
    "hf-llama": ("hf", {"arch": "llama", "size": "tiny"}, "model.layers."),
}


def _compile_blocks(workload) -> None:
    # the lever's default backend (inductor): the prediction compiles with its own instead
    handle = apply_to_workload(workload, ["compile-blocks"], quiet=True)
    assert not handle.skipped


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


@pytest.fixture(scope="module", params=sorted(SPECS))
def predictions(request):
    if request.param == "hf-llama":
        pytest.importorskip("transformers")
    spec, params, prefix = SPECS[request.param]
    source = source_of(spec, params)
    eager = run_prediction(source, H200, num_steps=2)
    breaks = _graph_breaks()
    compiled_run = run_prediction(source, H200, num_steps=2, transform=_compile_blocks)
    return eager, compiled_run, _graph_breaks() - breaks, prefix


def _activation_bytes(prediction, step: int, module: str | None = None) -> int:
    return sum(
        a.nbytes
        for a in prediction.trace.allocations
        if a.category == "activations"
        and a.step == step
        and (module is None or a.module == module or (a.module or "").startswith(module + "."))
    )


def test_blocks_compile_as_one_graph_without_breaks(predictions):
    eager, compiled_run, num_breaks, prefix = predictions
    # one graph that every block reuses (the tracker's module hooks and the stand-in's mode
    # are out of dynamo's sight), holding the block's one attention call
    assert [(g.module, g.num_attention_calls) for g in compiled_run.trace.compiled_graphs] == [
        (f"{prefix}0", 1)
    ]
    assert num_breaks == 0
    assert eager.trace.compiled_graphs == ()
    assert compiled.ASSUMPTION in compiled_run.trace.assumptions
    assert compiled.ASSUMPTION not in eager.trace.assumptions


def test_compiled_blocks_keep_the_target_gpus_attention_kernel(predictions):
    eager, compiled_run, _, _ = predictions

    def attention_ops(prediction) -> set[str]:
        return {a.op for a in prediction.trace.allocations if "scaled_dot_product" in a.op}

    # the H200's cuDNN attention, not the CPU's decomposition into a score matrix
    assert attention_ops(compiled_run) == attention_ops(eager)
    assert any("cudnn_attention" in op for op in attention_ops(compiled_run))
    assert not any("math" in op or "for_cpu" in op for op in attention_ops(compiled_run))
    # described once per call that ran, as eager describes them
    assert compiled_run.trace.sdpa_calls == eager.trace.sdpa_calls


def test_compiled_blocks_keep_fewer_activations(predictions):
    eager, compiled_run, _, prefix = predictions
    last = 1
    assert _activation_bytes(compiled_run, last) < _activation_bytes(eager, last)
    assert compiled_run.replay.peak_allocated_bytes <= eager.replay.peak_allocated_bytes
    # the rest of the step is as eager: parameters, gradients and optimizer state
    for category in ("parameters", "gradients", "optimizer"):
        assert sum(
            a.nbytes for a in compiled_run.trace.allocations if a.category == category
        ) == sum(a.nbytes for a in eager.trace.allocations if a.category == category)


def _block_inputs(spec: str, params: dict, index: int) -> tuple:
    """A block of the workload, with the arguments of its first call, as an eager prediction
    ran it (fake tensors, bf16 autocast as on the GPU)."""
    captured: dict = {}

    def keep(workload) -> None:
        from levers.blocks import repeated_blocks

        block = repeated_blocks(workload.model)[index].module

        def hook(module, args, kwargs):
            captured.setdefault("call", (module, args, kwargs))

        block.register_forward_pre_hook(hook, with_kwargs=True)

    run_prediction(source_of(spec, params), H200, num_steps=1, transform=keep)
    return captured["call"]


def _kept_by_block_compiled_outside(block, args: tuple, kwargs: dict) -> int:
    """The bytes a block keeps for backward, compiled with the same backend outside the
    predictor (no tracker, no stand-in: the block's fakes under CUDA's autocast lists and
    composites, which decide the ops the graph holds, as on the GPU): the
    storages that ``saved_tensors_hooks`` sees saved, less the block's inputs and parameters,
    and the block's output (alive at backward too, saved by the module after it)."""
    given = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    inputs = {_storage_key(t) for t in [*given, *block.parameters()]}
    saved: dict[int, int] = {}
    kept = []  # alive while counting, so that no storage's address is reused

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept.append(tensor)
        if _storage_key(tensor) not in inputs:
            saved[_storage_key(tensor)] = tensor.untyped_storage().nbytes()
        return tensor

    handler = _sdpa_handler(types.SimpleNamespace(sdpa_calls=[]), sdpa.target_for(H200.sm))
    block.compile()
    try:
        with cuda_composites(DeviceBook()), cuda_autocast_policy():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                with compiled.predicting(handler) as graphs:
                    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                        out = block(*args, **kwargs)
    finally:
        vars(block).pop("_compiled_call_impl", None)
    assert len(graphs) == 1  # compiled, as one graph
    out = out[0] if isinstance(out, tuple) else out
    saved.pop(_storage_key(out), None)
    return sum(saved.values()), out.untyped_storage().nbytes()


def _storage_key(tensor: torch.Tensor) -> int:
    # the storage's own address: untyped_storage() makes a new Python object at every call
    return tensor.untyped_storage()._cdata


def test_a_compiled_blocks_activations_are_what_it_saves_compiled_outside(predictions):
    eager, compiled_run, _, prefix = predictions
    spec, params = next((s, p) for s, p, x in SPECS.values() if x == prefix)
    block, args, kwargs = _block_inputs(spec, params, 1)
    saved_bytes, output_bytes = _kept_by_block_compiled_outside(block, args, kwargs)
    predicted = _activation_bytes(compiled_run, 0, f"{prefix}1")
    assert predicted == saved_bytes + output_bytes
    # what the partition returned for backward, as the backend read it off the graph
    assert compiled_run.trace.compiled_graphs[0].saved_bytes == saved_bytes
    # and less than the block keeps eager
    assert predicted < _activation_bytes(eager, 0, f"{prefix}1")


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset = torch.arange(x.shape[-1]).float()  # made inside the compiled graph
        return x + self.down(torch.nn.functional.gelu(self.up(x + offset)))


def compiled_without_device(batch_size: int = 32):
    """A factory that takes no device (run under ``torch.device("cuda")``) and compiles its
    blocks itself."""
    from levers.workload import Workload

    model = torch.nn.Sequential(*[_Block() for _ in range(3)])
    for block in model:
        block.compile()
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch_size, 64)

    def step() -> None:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    return Workload(model=model, step=step, optimizer=optimizer)


def test_a_factory_that_compiles_under_a_cuda_default_device():
    # without the stand-in, torch.device("cuda") would put CUDA tensors in the graph
    prediction = run_prediction(source_of(compiled_without_device), H200, num_steps=2)
    # as dynamo compiles Module.compile()d blocks on real tensors without the lever's setup:
    # the second block once more, the third reusing its graph
    assert [g.module for g in prediction.trace.compiled_graphs] == ["0", "1"]
    assert compiled.ASSUMPTION in prediction.trace.assumptions
    # the gelu's input (32 x 256 fp32) is recomputed from the up projection's input in the
    # backward instead of kept: each block keeps its output and the up projection's output
    kept = {a.shape for a in prediction.trace.allocations if a.category == "activations"}
    assert (32, 256) in kept


def test_inductor_fuses_pointwise_ops_read_only_by_pointwise_ops_and_reductions():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        gate = torch.sigmoid(x)  # read by a mul: fused
        act = gate * x  # read by a matmul: inductor makes a buffer for it
        scaled = act.double() * 2.0  # read by a sum through a view: fused
        total = scaled.view(-1).sum()
        kept = x.exp()  # returned: a buffer
        return act @ w, total, kept

    graph = make_fx(f)(torch.randn(4, 8), torch.randn(8, 3)).graph
    fused = {str(n.target) for n in compiled.fused_intermediates(graph)}
    assert fused == {"aten.sigmoid.default", "aten._to_copy.default", "aten.mul.Tensor"}
    mul_nodes = [n for n in graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    # of the two muls, the one the matmul reads is not fused
    assert [n in compiled.fused_intermediates(graph) for n in mul_nodes] == [False, True]


class _PointwiseChain(torch.nn.Module):
    """A block whose activation passes through a chain of elementwise ops between matmuls."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 1024), torch.nn.Linear(1024, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x).float()
        h = torch.sigmoid(h) * h * 0.5 + torch.tanh(h)
        return x + self.down(h.to(x.dtype))


def pointwise_chain(batch_size: int = 256):
    from levers.workload import Workload

    model = torch.nn.Sequential(*[_PointwiseChain() for _ in range(2)])
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch_size, 64)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return Workload(model=model, step=step, optimizer=optimizer)


def test_a_compiled_blocks_fused_elementwise_chain_takes_no_memory(monkeypatch):
    source = source_of(pointwise_chain)
    fused = run_prediction(source, H200, num_steps=2, transform=_compile_blocks)
    monkeypatch.setattr(compiled, "run_fused", lambda gm: 0)  # every op books its output
    unfused = run_prediction(source, H200, num_steps=2, transform=_compile_blocks)

    def temporaries(prediction) -> int:
        return sum(a.nbytes for a in prediction.trace.allocations if a.category == "temporaries")

    # the chain's float32 [256, 1024] intermediates (1 MiB each) exist only op by op
    assert temporaries(unfused) - temporaries(fused) >= 8 * 256 * 1024 * 4
    assert fused.replay.peak_allocated_bytes < unfused.replay.peak_allocated_bytes
    # what the blocks save for backward is the partition's either way
    assert [g.saved_bytes for g in fused.trace.compiled_graphs] == [
        g.saved_bytes for g in unfused.trace.compiled_graphs
    ]


def test_a_compiled_loss_is_one_graph_that_keeps_no_log_probabilities():
    """compile-loss's loss function, predicted as inductor partitions it: one graph named after
    the loss, without breaks, and the eager loss's fp32 log-probabilities (kept for backward)
    gone from what the step keeps."""
    pytest.importorskip("transformers")
    source = source_of("hf", {"arch": "llama", "size": "tiny"})
    eager = run_prediction(source, H200, num_steps=2)
    breaks = _graph_breaks()

    def compile_loss(workload) -> None:
        assert not apply_to_workload(workload, ["compile-loss"], quiet=True).skipped

    compiled_run = run_prediction(source, H200, num_steps=2, transform=compile_loss)
    assert [g.module for g in compiled_run.trace.compiled_graphs] == ["loss_function"]
    assert _graph_breaks() == breaks

    def log_softmax_kept(prediction) -> int:
        return sum(a.nbytes for a in prediction.trace.allocations
                   if a.category == "activations" and a.step == 1 and "log_softmax" in a.op)

    assert log_softmax_kept(eager) > 0
    assert log_softmax_kept(compiled_run) == 0
    assert _activation_bytes(compiled_run, 1) < _activation_bytes(eager, 1)
