"""The resident bytes of an A/B side: every storage once, wrapper subclasses through their insides.

On a GPU, tune's A/B of adamw-8bit raised "Attempted to access the data pointer on an invalid
python storage" (vit, phi on the H200): torchao's 8-bit optimizer state is a wrapper subclass with
no storage of its own. The count is device-agnostic, so the CPU checks it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

from levers.ab.memory import resident_bytes, storage_bytes


def test_a_storage_shared_by_views_counts_once():
    base = torch.zeros(64, 32)
    assert storage_bytes([base, base[1:], base.t()], "cpu") == 64 * 32 * 4


def test_tensors_on_another_device_are_left_out():
    assert storage_bytes([torch.zeros(8, device="meta"), torch.zeros(4)], "cpu") == 16


def test_a_wrapper_subclass_counts_the_storages_inside_it():
    a, b = torch.zeros(10), torch.zeros(20)[:10]
    wrapped = TwoTensor(a, b)
    try:
        wrapped.untyped_storage().data_ptr()
        raises = False
    except RuntimeError:
        raises = True
    assert raises, "the wrapper's own storage is expected to have no pointer"
    assert storage_bytes([wrapped], "cpu") == 10 * 4 + 20 * 4
    # its inner tensors listed again are not counted twice
    assert storage_bytes([wrapped, a, b], "cpu") == 10 * 4 + 20 * 4


def test_the_state_of_torchaos_8bit_adamw_is_counted():
    from torchao.optim import AdamW8bit

    param = torch.nn.Parameter(torch.randn(512, 256))
    optimizer = AdamW8bit([param], block_size=256)
    param.grad = torch.randn_like(param)
    optimizer.step()
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    total = storage_bytes(state, "cpu")
    # two moments of one byte per element, plus their per-block scales and the code maps
    assert 2 * 512 * 256 <= total < 2 * 512 * 256 * 1.1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_side_with_8bit_adamw_state_on_the_gpu_has_its_resident_bytes():
    from torchao.optim import AdamW8bit

    model = torch.nn.Linear(1024, 1024, bias=False, device="cuda")
    optimizer = AdamW8bit(model.parameters(), block_size=256)
    model(torch.randn(4, 1024, device="cuda")).sum().backward()
    optimizer.step()
    side = SimpleNamespace(device="cuda", model=model, optimizer=optimizer)
    weight_and_grad = 2 * 1024 * 1024 * 4
    assert weight_and_grad + 2 * 1024 * 1024 <= resident_bytes(side) < weight_and_grad * 1.3
