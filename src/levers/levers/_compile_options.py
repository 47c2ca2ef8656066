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

from levers.levers._option_values import choice, flag

# inductor's modes (``torch._inductor.list_mode_options()``, less torch 2.13's "lite")
INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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
    if options.get("mode") is not None:
        choice(lever, "mode", options["mode"], modes)
    backend = options.get("backend")
    if backend is not None and not callable(backend) and str(backend) not in _backends(()):
        raise ValueError(
            f"{lever}: backend={backend!r} is not a backend torch.compile knows, such as "
            f"{', '.join(_backends())} (torch._dynamo.list_backends() lists them)"
        )
    if "dynamic" in options:
        flag(lever, "dynamic", options["dynamic"], allow_none=True)
    if "fullgraph" in options:
        flag(lever, "fullgraph", options["fullgraph"])


def compile_kwargs(lever: str, options: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The options among ``keys`` as ``torch.compile`` takes them: ``dynamic`` and ``fullgraph``
    as booleans (``dynamic`` may be None), the others as given."""
    kwargs = {k: v for k, v in options.items() if k in keys}
    if "dynamic" in kwargs:
        kwargs["dynamic"] = flag(lever, "dynamic", kwargs["dynamic"], allow_none=True)
    if "fullgraph" in kwargs:
        kwargs["fullgraph"] = flag(lever, "fullgraph", kwargs["fullgraph"])
    return kwargs
