"""What the user asks of one audit, declared once.

``levers audit``'s flags, :meth:`levers.Step.audit`'s keywords and the in-script auditors all
become one :class:`AuditOptions` at the border (:meth:`AuditOptions.checked`: the GPU name
resolved to its spec, the torch version, the dtype and the rule selectors checked before any long
work), and the record is passed whole down to the analysis (:func:`levers.audit.run.audit_step`,
:func:`levers.audit.engine.audit`, :func:`levers.audit.config.make_config`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from levers.audit.config import DEFAULT_TARGET, dtype_of, parse_torch_version
from levers.audit.rules.registry import select_rules
from levers.hardware import GpuSpec, resolve_gpu


@dataclass(frozen=True)
class AuditOptions:
    """One audit's options.

    ``gpu``: the GPU a CPU capture is priced on (and the memory model predicts for), resolved;
    None when the user named none (the default target, :data:`DEFAULT_TARGET`; on a GPU capture
    the GPU that ran decides either way). ``torch_version``: the torch the findings are for
    (``"2.11"``; None: the capture's). ``assume_dtype``: the dtype a CPU capture in fp32 is
    priced in on the GPU (``bf16``, ``fp16``, ``fp32``; None: bf16). ``select`` / ``ignore``:
    rule codes or prefixes. ``benchmark``: on a GPU capture, time the fixes' microbenchmarks.
    ``memory_model``: predict the step's memory for the rules that read it. ``workload_spec``
    and ``set_items``: the workload and ``--set`` items as the user gave them, for the commands
    the report prints.
    """

    gpu: GpuSpec | None = None
    torch_version: str | None = None
    assume_dtype: str | None = None
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    benchmark: bool = True
    memory_model: bool = True
    workload_spec: str | None = None
    set_items: tuple[str, ...] = ()

    @classmethod
    def checked(
        cls,
        *,
        gpu: str | GpuSpec | None = None,
        torch_version: str | None = None,
        assume_dtype: str | None = None,
        select: Iterable[str] = (),
        ignore: Iterable[str] = (),
        benchmark: bool = True,
        memory_model: bool = True,
        workload_spec: str | None = None,
        set_items: Iterable[str] = (),
    ) -> AuditOptions:
        """The record of what the user gave, each value checked.

        Raises:
            ValueError: an unknown GPU, a malformed torch version, an unknown dtype or a rule
                selector that matches no rule; the message says what to pass instead.
        """
        options = cls(
            gpu=None if gpu is None else resolve_gpu(gpu, allow_budget=False, option="--gpu"),
            torch_version=torch_version,
            assume_dtype=assume_dtype,
            select=tuple(select),
            ignore=tuple(ignore),
            benchmark=benchmark,
            memory_model=memory_model,
            workload_spec=workload_spec,
            set_items=tuple(set_items),
        )
        select_rules(options.select, options.ignore)
        if torch_version is not None:
            parse_torch_version(torch_version)
        if assume_dtype is not None:
            dtype_of(assume_dtype)
        return options

    @property
    def target(self) -> GpuSpec:
        """The GPU a CPU capture is priced on: the one named, else :data:`DEFAULT_TARGET`."""
        return self.gpu if self.gpu is not None else resolve_gpu(DEFAULT_TARGET)

    def with_workload(self, workload_spec: str | None) -> AuditOptions:
        """These options for the workload spec the user gave (where none was given yet)."""
        return replace(self, workload_spec=self.workload_spec or workload_spec)
