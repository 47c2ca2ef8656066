"""Finding what a lever changes, by pattern: attributes first, then a numerical probe.

A lever never trusts a class name alone. An RMSNorm is any leaf module with a 1-D ``weight`` and
an epsilon attribute whose forward, on a probe input, computes ``x * rsqrt(mean(x^2) + eps)``
times ``weight`` (or ``1 + weight``, Gemma's form), and whose output dtype follows a rule that
the replacement can reproduce. Hugging Face models are recognised by their config; the built-in
``demo`` by its ``fixes`` switches.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from levers.block_checkpoint import caching_configs, training_cache_off  # noqa: F401 - re-exported

EPS_ATTRIBUTES = ("eps", "variance_epsilon", "epsilon")
FUSED_MARK = "_levers_fused_rms_norm"  # set on a module whose forward a lever replaced


@dataclass(frozen=True)
class RmsNormSite:
    path: str
    module: torch.nn.Module
    eps: float
    weight_offset: float  # 0.0: x_hat * w (Llama); 1.0: x_hat * (1 + w) (Gemma)
    output_rule: str  # "input": the input's dtype; "promote": promote(input, weight) (Llama)


class _Calls(TorchFunctionMode):
    """Records which torch functions a forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.called: set[Any] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.called.add(func)
        return func(*args, **(kwargs or {}))


def _eps_of(module: torch.nn.Module) -> float | None:
    for name in EPS_ATTRIBUTES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def _is_real(tensor: torch.Tensor) -> bool:
    # a fake or meta parameter cannot be probed
    return tensor.device.type != "meta" and type(tensor) in (torch.Tensor, torch.nn.Parameter)


def probe_rms_norm(path: str, module: torch.nn.Module) -> RmsNormSite | None:
    """The site if ``module`` computes an unfused RMSNorm, else None."""
    if isinstance(module, torch.nn.RMSNorm) or getattr(module, FUSED_MARK, False):
        return None  # already PyTorch's fused norm
    if next(module.children(), None) is not None:
        return None  # a norm is a leaf
    weight = getattr(module, "weight", None)
    eps = _eps_of(module)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or eps is None:
        return None
    if not weight.is_floating_point() or not _is_real(weight):
        return None
    try:
        return _probe(path, module, weight, eps)
    except Exception:  # noqa: BLE001 - a module the probe cannot run (one tensor in, fake weights)
        return None


def _probe(path: str, module: torch.nn.Module, weight: torch.Tensor, eps: float) -> RmsNormSite | None:
    width = weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, width, generator=generator).to(weight.device, weight.dtype)
    calls = _Calls()
    with torch.no_grad(), calls:
        out = module(x)
        out_low = module(x.to(torch.bfloat16))
    if F.rms_norm in calls.called or F.layer_norm in calls.called:
        return None
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        return None
    x32 = x.float()
    x_hat = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    rtol = 1e-4 if weight.dtype == torch.float32 else 2e-2
    offset = None
    for candidate in (0.0, 1.0):
        expected = x_hat * (candidate + weight.float())
        if torch.allclose(out.float(), expected, rtol=rtol, atol=rtol):
            offset = candidate
            break
    if offset is None:
        return None
    if _ignores_weight(module, width, weight):
        return None
    if out_low.dtype == torch.bfloat16:
        rule = "input"
    elif out_low.dtype == torch.promote_types(torch.bfloat16, weight.dtype):
        rule = "promote"
    else:
        return None
    return RmsNormSite(path, module, eps, offset, rule)


def _ignores_weight(module: torch.nn.Module, width: int, weight: torch.Tensor) -> bool:
    """True when ``module`` normalises an input wider than its weight without complaint: its
    forward never multiplies by the weight (Falcon-Mamba's weightless norms keep a dummy weight
    of ones, of another width than the inputs they see), so it is no RMSNorm of that weight."""
    x = torch.ones(1, width + 1, device=weight.device, dtype=weight.dtype)
    try:
        with torch.no_grad():
            out = module(x)
    except Exception:  # noqa: BLE001 - the weight's width is enforced: a real norm
        return False
    return isinstance(out, torch.Tensor) and out.shape == x.shape


def rms_norm_sites(model: torch.nn.Module) -> list[RmsNormSite]:
    """Every unfused RMSNorm in ``model``, probed once per module."""
    sites = []
    for path, module in model.named_modules():
        site = probe_rms_norm(path, module)
        if site is not None:
            sites.append(site)
    return sites


# -- Hugging Face --------------------------------------------------------------------------


def is_hf_model(model: torch.nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.") and hasattr(model, "config")


def hf_configs(model: torch.nn.Module) -> list[Any]:
    """The distinct configs the modules of a Hugging Face model read (text, vision, ...)."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            seen.setdefault(id(config), config)
    return list(seen.values())


def forward_source(module: Any) -> str | None:
    """The source of ``module``'s class's ``forward`` (what the checks below read for the calls
    it makes), or None where it cannot be read (built-ins, code made at run time)."""
    try:
        return inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return None


def hf_causal_lm_parts(model: torch.nn.Module) -> tuple[Any, torch.nn.Linear] | str:
    """(base model, lm_head) of a Hugging Face causal LM with the standard loss, or why not."""
    if not is_hf_model(model):
        return "not a Hugging Face model"
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Linear):
        return "no nn.Linear lm_head"
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        return "no base model under the head"
    config = model.config
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, name, None) not in (None, 1.0):
            return f"its logits are transformed after the head ({name}={getattr(config, name)})"
    loss_type = getattr(model, "loss_type", None)
    if loss_type not in (None, "ForCausalLM"):
        return f"its loss is {loss_type!r}, not the standard causal-LM cross-entropy"
    source = forward_source(model)
    if source is None:
        return "its forward's source cannot be read to check the loss"
    if "self.loss_function(" not in source or "self.lm_head(" not in source:
        return "its forward does not compute lm_head then self.loss_function"
    return base, head


def _not_masked_lm(model: torch.nn.Module) -> str | None:
    """Why ``model`` is not a masked LM whose labels can be narrowed to the rows, or None for a
    ``*ForMaskedLM`` and for a class transformers' masked-LM mapping names that is not an
    encoder-decoder: XLM's and Flaubert's ``*WithLMHeadModel``, whose prediction layer takes the
    cross-entropy of every token's logits against its own label, unshifted, as a masked LM's does.
    The encoder-decoders of that mapping (BART's ``*ForConditionalGeneration``) build their
    decoder's inputs from the labels."""
    name = type(model).__name__
    if name.endswith("ForMaskedLM"):
        return None
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:  # a transformers without the auto mappings: the name alone decides
        mapped: Any = {}
    else:
        mapped = getattr(modeling_auto, "MODEL_FOR_MASKED_LM_MAPPING_NAMES", {})
    if name not in mapped.values():
        return "not a masked LM (a transformers *ForMaskedLM, or a class of its masked-LM mapping)"
    if getattr(model.config, "is_encoder_decoder", False):
        return (f"{name} is an encoder-decoder: its decoder's inputs are made from the labels, so "
                "they cannot be narrowed to the rows with a target")
    return None


def hf_masked_lm_head(model: torch.nn.Module) -> torch.nn.Linear | str:
    """The output projection of a Hugging Face masked LM (``get_output_embeddings()``: BERT's
    ``cls.predictions.decoder``, RoBERTa's ``lm_head.decoder``), or why not."""
    if not is_hf_model(model):
        return "not a Hugging Face model"
    why_not = _not_masked_lm(model)
    if why_not is not None:
        return why_not
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return "no output embeddings (get_output_embeddings) to find its projection by"
    if not isinstance(head, torch.nn.Linear):
        return f"its output projection is not an nn.Linear ({type(head).__name__})"
    source = forward_source(model)
    if source is None:
        return "its forward's source cannot be read to check the loss"
    if "labels" not in source:
        return "its forward takes no labels"
    # the projection must be called as a module on the tokens (MobileBERT's head multiplies by
    # its weight, concatenated with another, and never calls it)
    owner = next(((parent, name) for parent in model.modules()
                  for name, child in parent.named_children() if child is head), None)
    if owner is None:
        return "its output projection is not a submodule of the model"
    parent, name = owner
    parent_source = forward_source(parent)
    if parent_source is None:
        return f"the forward of {type(parent).__name__}, which holds the projection, cannot be read"
    if f"self.{name}(" not in parent_source:
        return (f"{type(parent).__name__} does not call its projection ({name}) as a module on "
                "the tokens (it uses its weight)")
    return head


def head_forward_reason(head: torch.nn.Linear) -> str | None:
    """Why the logits are not ``hidden @ head.weight.T`` (+ bias), or None: a head subclassing
    nn.Linear with a forward of its own (Dory's DoryLMHead scales each token's logit by a learned
    weight). What recomputes the logits from the head's weight must refuse it; what calls the head
    itself need not."""
    if type(head).forward is torch.nn.Linear.forward:
        return None
    return f"its lm_head ({type(head).__name__}) computes more than hidden @ weight.T (a forward of its own)"


# -- the built-in demo ---------------------------------------------------------------------


def demo_switches(model: torch.nn.Module, flag: str) -> Iterator[torch.nn.Module]:
    """Modules holding a frozen ``fixes`` dataclass with ``flag`` still off (the demo's model)."""
    for module in model.modules():
        fixes = getattr(module, "fixes", None)
        if dataclasses.is_dataclass(fixes) and getattr(fixes, flag, None) is False:
            yield module


def source_mentions(model: torch.nn.Module, *needles: str) -> bool:
    """Whether the source file of any module class of ``model`` mentions one of ``needles``."""
    files = set()
    for module in model.modules():
        try:
            files.add(inspect.getsourcefile(type(module)))
        except TypeError:
            continue
    for path in files:
        if path is None or "/torch/nn/" in path:
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except OSError:
            continue
        if any(needle in text for needle in needles):
            return True
    return False
