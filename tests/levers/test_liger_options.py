"""liger-kernels passes each Liger patch the keywords it takes (no GPU or Liger needed)."""

from __future__ import annotations

from levers.levers.liger_kernels import PATCHES, options_for


def apply_liger_kernel_to_gemma(rope=True, cross_entropy=False, fused_linear_cross_entropy=True,
                                rms_norm=True, geglu=True, model=None):
    """Liger 0.8.5's gemma patch: its MLP's kernel is geglu, and it takes no swiglu."""


def apply_liger_kernel_to_llama(rope=True, cross_entropy=False, fused_linear_cross_entropy=True,
                                rms_norm=True, swiglu=True, model=None):
    """Liger 0.8.5's llama patch."""


def apply_liger_kernel_to_future(model=None, **kwargs):
    """A patch that takes any keyword."""


def test_a_patch_without_swiglu_gets_its_mlp_kernel_by_its_own_name():
    # zoo gemma on the H200 (s38): apply_liger_kernel_to_gemma() got an unexpected keyword
    # argument 'swiglu'
    options = options_for(apply_liger_kernel_to_gemma, PATCHES)
    assert "swiglu" not in options
    assert options == {"rope": True, "geglu": True, "rms_norm": True, "cross_entropy": False,
                       "fused_linear_cross_entropy": False}
    off = options_for(apply_liger_kernel_to_gemma, {**PATCHES, "swiglu": False})
    assert off["geglu"] is False


def test_a_patch_that_takes_every_option_gets_them_all():
    assert options_for(apply_liger_kernel_to_llama, PATCHES) == PATCHES
    assert options_for(apply_liger_kernel_to_future, PATCHES) == PATCHES
