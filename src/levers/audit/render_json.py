"""The findings report as JSON (schema ``levers.audit/1``), as ``levers audit --findings-json``
writes it, and under the key ``"audit"`` of the capture file ``levers audit --json`` writes:

    {"schema": "levers.audit/1", "config": {...}, "step": {...},
     "findings": [{"rank": 1, "payoff": 0.12, "code": ..., "cost": {...}, ...}, ...],
     "already_right": [{"code": ..., "title": ..., "detail": ...}, ...]}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from levers.capture.records import Capture
from levers.output.atomic import atomic_open
from levers.capture.json_io import capture_to_dict, check_writable
from levers.audit.report import FindingsReport

AUDIT_SCHEMA = "levers.audit/1"


def audit_to_dict(report: FindingsReport, *, config: Any = None) -> dict[str, Any]:
    findings = []
    for rank, (f, pay) in enumerate(zip(report.findings, report.payoffs), start=1):
        data = f.to_dict()
        data.pop("work", None)
        data["rank"] = rank
        data["payoff"] = pay
        findings.append(data)
    out: dict[str, Any] = {
        "schema": AUDIT_SCHEMA,
        "step": dataclasses.asdict(report.head),
        "active_rules": list(report.active_codes),
        "findings": findings,
        "already_right": [dataclasses.asdict(a) for a in report.already_right],
    }
    if report.bottleneck is not None:
        b = report.bottleneck
        out["bottleneck"] = {
            **dataclasses.asdict(b),
            "fixed_ms": b.fixed_ms,
            "classes": [
                {**dataclasses.asdict(c), "efficiency": c.efficiency,
                 "above_ceiling_ms": c.above_ceiling_ms}
                for c in b.classes
            ],
        }
    if report.recommendation is not None:
        out["recommendation"] = dataclasses.asdict(report.recommendation)
    if config is not None:
        out["config"] = {
            "gpu": config.gpu.family,
            "torch_version": ".".join(map(str, config.torch_version)),
            "on_gpu": config.on_gpu,
            "assumed_dtype": config.assumed_dtype,
            "cudnn_version": config.cudnn_version,
        }
    return _plain(out)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_findings(
    report: FindingsReport, path: str | os.PathLike[str], *, config: Any = None
) -> None:
    """The audit alone (``levers audit --findings-json FILE``), atomically."""
    check_writable(path)
    with atomic_open(path) as f:
        json.dump(audit_to_dict(report, config=config), f, indent=1, allow_nan=False)
        f.write("\n")
