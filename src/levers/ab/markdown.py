"""The Markdown view of an A/B result, ready to paste into a pull request."""

from __future__ import annotations

from typing import Any, Sequence

from levers.ab.expectations import Outcome
from levers.ab.format import HEADERS, design_line, quality_line, rows, side_line
from levers.ab.freeze import FreezeState
from levers.ab.runner import AbResult


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(headers: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return lines


def _environment_line(env: dict[str, Any]) -> str:
    gpu = env.get("gpu")
    hardware = (
        f"{gpu['name']} (driver {gpu['driver']}, CUDA {gpu['cuda']})"
        if gpu
        else f"{env.get('cpu')} ({env.get('num_threads')} threads)"
    )
    commit = env.get("workdir_commit") or (
        {"commit": env["levers_commit"], "dirty": env.get("levers_commit_dirty")}
        if env.get("levers_commit") else None
    )
    at = f"{commit['commit'][:12]}{' (dirty)' if commit['dirty'] else ''}" if commit else "unknown"
    return f"{hardware}; torch {env.get('torch')}; commit {at}"


def to_markdown(
    result: AbResult,
    environment: dict[str, Any],
    outcomes: Sequence[Outcome] = (),
    freeze: FreezeState | None = None,
) -> str:
    lines = [f"### levers ab: **{result.decision}**", ""]
    lines += [
        f"- {side_line(result, 'baseline')}",
        f"- {side_line(result, 'candidate')}",
        f"- {design_line(result)}",
        f"- {_environment_line(environment)}",
    ]
    if freeze is not None:
        lines.append(
            f"- pre-registration sha256 `{freeze.sha256[:16]}` ({freeze.num_amendments} "
            f"amendment(s)), record `{freeze.record_path}`"
        )
    lines += [""] + _table(HEADERS, rows(result))
    if result.quality is not None:
        lines += ["", f"- {quality_line(result.quality)}"]
    if outcomes:
        lines += ["", "**Pre-registered expectations**", ""]
        met = {True: "met", False: "missed", None: "not measured"}
        lines += _table(
            ("#", "read", "expected", "confidence", "met", "evidence"),
            [
                (
                    str(o.expectation.id),
                    o.expectation.read,
                    f"{o.expectation.direction} by {o.expectation.size:g}",
                    o.expectation.confidence,
                    met[o.met],
                    o.evidence,
                )
                for o in outcomes
            ],
        )
    if result.parity is not None and result.parity.checks:
        lines += ["", "<details><summary>parity evidence</summary>", ""]
        lines += _table(
            (
                "step",
                "quantity",
                "baseline",
                "candidate",
                "relative diff",
                "float64 run",
                "error b / c (allowed)",
                "tolerance",
                "passed",
            ),
            [
                (
                    str(c.step),
                    c.quantity,
                    f"{c.baseline:.6g}" if c.baseline is not None else "n/a",
                    f"{c.candidate:.6g}" if c.candidate is not None else "n/a",
                    f"{c.rel_diff:.3g}" if c.rel_diff is not None else "n/a",
                    f"{c.reference:.6g}" if c.reference is not None else "n/a",
                    f"{c.baseline_error:.3g} / {c.candidate_error:.3g} ({c.allowed_error:.3g})"
                    if c.allowed_error is not None
                    else "n/a",
                    f"{c.rtol:g}" + (" (floor)" if c.allowed_error is not None else ""),
                    {True: "yes", False: "NO", None: "n/a"}[c.passed]
                    + ("" if c.gating else " (info)"),
                )
                for c in result.parity.checks
            ],
        )
        lines += ["", "</details>"]
    for note in result.warnings:
        lines.append(f"\n> warning: {note}")
    if result.killed is not None:
        lines.append(f"\n> **KILLED** ({result.killed.kind}): {result.killed.message}")
    return "\n".join(lines) + "\n"
