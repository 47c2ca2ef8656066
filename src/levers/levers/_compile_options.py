"""The options the compile levers (compile-model, compile-blocks, compile-loss) pass to
``torch.compile``: checked when the lever is named, before anything is built or timed, and read
from a spec's text into the types torch takes.

On the command line every option is text (``compile-blocks:fullgraph=false``), and torch reads
``fullgraph="false"`` as true and refuses ``dynamic="false"`` with an assertion deep in dynamo;
an unknown mode or backend failed only when the lever was applied, after the baseline was built,
as an internal error. Here a wrong value is refused with the values that are accepted, and the
two flags are read as the booleans they name.
"""

from __future__ import annotations

from typing import Any

# inductor's modes (``torch._inductor.list_mode_options()``, less torch 2.13's "lite")
INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_NONE = ("none", "auto")  # dynamic: dynamo's automatic choice (torch.compile's default)


def _flag(lever: str, key: str, value: Any, allow_none: bool) -> bool | None:
    if value is None and allow_none or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if allow_none and text in _NONE:
        return None
    accepted = "true or false" + (" (or none: dynamo's choice)" if allow_none else "")
    raise ValueError(f"{lever}: {key}={value!r} is not {accepted}")


def _backends(exclude_tags: tuple[str, ...] = ("debug", "experimental")) -> list[str]:
    """torch.compile's registered backends, those of the tags ``exclude_tags`` left out."""
    import torch._dynamo  # the lever imports dynamo anyway once it compiles

    return sorted(torch._dynamo.list_backends(exclude_tags=exclude_tags))


def check_compile_options(
    lever: str, options: dict[str, Any], modes: tuple[str, ...] = INDUCTOR_MODES
) -> None:
    """Refuse a ``mode`` not in ``modes``, a ``backend`` torch does not know, a ``dynamic`` or
    ``fullgraph`` that is not a boolean, each with what is accepted.

    Raises:
        ValueError: the first option that is wrong.
    """
    mode = options.get("mode")
    if mode is not None and str(mode) not in modes:
        raise ValueError(f"{lever}: mode={mode!r} is not one of {', '.join(modes)}")
    backend = options.get("backend")
    if backend is not None and not callable(backend) and str(backend) not in _backends(()):
        raise ValueError(
            f"{lever}: backend={backend!r} is not a backend torch.compile knows, such as "
            f"{', '.join(_backends())} (torch._dynamo.list_backends() lists them)"
        )
    if "dynamic" in options:
        _flag(lever, "dynamic", options["dynamic"], allow_none=True)
    if "fullgraph" in options:
        _flag(lever, "fullgraph", options["fullgraph"], allow_none=False)


def compile_kwargs(lever: str, options: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The options among ``keys`` as ``torch.compile`` takes them: ``dynamic`` and ``fullgraph``
    as booleans (``dynamic`` may be None), the others as given."""
    kwargs = {k: v for k, v in options.items() if k in keys}
    if "dynamic" in kwargs:
        kwargs["dynamic"] = _flag(lever, "dynamic", kwargs["dynamic"], allow_none=True)
    if "fullgraph" in kwargs:
        kwargs["fullgraph"] = _flag(lever, "fullgraph", kwargs["fullgraph"], allow_none=False)
    return kwargs
