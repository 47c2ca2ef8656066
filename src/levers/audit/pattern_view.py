"""The patterns of one capture, found once and read by every rule and by the bottleneck.

    view = pattern_view(capture)
    view.eager_attention   # ATTN002's chains; COPY002 and the bottleneck read the same ones
    view.backward          # forward op index -> the backward ops its autograd node ran

Several readers need the same pattern: hand-written attention is ATTN002's finding, the ops
COPY002 leaves to ATTN002, and the bottleneck's attention class. Each finder runs the first time
its pattern is read, and once per capture: a Capture is immutable, so its view is kept for as
long as the capture lives and every later reader (another rule, the bottleneck, a second audit of
the same capture) gets the same tuples. Rules stay pure functions of the capture.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from levers.capture.records import Capture
from levers.audit import patterns, patterns_attention, patterns_fusion, patterns_norm
from levers.audit.patterns_attention import AttentionChain
from levers.audit.patterns_fusion import Chain
from levers.audit.patterns_norm import NormChain


@dataclass(frozen=True, eq=False)
class PatternView:
    """The patterns of one capture, each found on first read (see the module docstring).

    It holds its capture weakly, so that the cache below lets the capture go.
    """

    _capture: weakref.ref

    @property
    def capture(self) -> Capture:
        capture = self._capture()
        assert capture is not None, "a PatternView outlived its capture"
        return capture

    @cached_property
    def backward(self) -> Mapping[int, tuple[int, ...]]:
        """forward op index -> indices of the backward ops its autograd node ran."""
        found = patterns.backward_index(self.capture)
        return MappingProxyType({i: tuple(b) for i, b in found.items()})

    @cached_property
    def eager_attention(self) -> tuple[AttentionChain, ...]:
        """Attention written out by hand (matmul, softmax, matmul): ATTN002's pattern."""
        return tuple(patterns_attention.find_eager_attention(self.capture))

    @cached_property
    def unfused_norms(self) -> tuple[NormChain, ...]:
        """RMSNorm and LayerNorm written as elementwise ops: NORM001's pattern."""
        return tuple(patterns_norm.find_unfused_norms(self.capture))

    @cached_property
    def gated_activations(self) -> tuple[Chain, ...]:
        """silu(gate) * up (and gelu) as two kernels: FUSE001's pattern."""
        return tuple(patterns_fusion.find_gated_activations(self.capture))

    @cached_property
    def unfused_rope(self) -> tuple[Chain, ...]:
        """Rotate-half RoPE as separate kernels: FUSE002's pattern."""
        return tuple(patterns_fusion.find_unfused_rope(self.capture))


# id(capture) -> its view; an entry goes when its capture is collected
_VIEWS: dict[int, PatternView] = {}


def pattern_view(capture: Capture) -> PatternView:
    """The one view of ``capture``'s patterns (made on first call, kept while it lives)."""
    key = id(capture)
    view = _VIEWS.get(key)
    if view is None:
        view = PatternView(weakref.ref(capture))
        _VIEWS[key] = view
        weakref.finalize(capture, _VIEWS.pop, key, None)
    return view
