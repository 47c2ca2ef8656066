"""Quality reads: is the candidate run better than the baseline on the same examples?

The read is the mean per-example difference ``candidate - baseline`` over the ids both files
hold, with a seeded paired bootstrap CI95 (pairs resampled together, so how hard an example is
cancels out). The verdict follows ab's rule around 0: IMPROVED if the whole CI lies on the good
side, DAMAGED if on the bad side, PARITY if it contains 0.

- Unmatched ids (in one file only) are counted and left out of a paired read.
- An unpaired read (each side's mean over all its rows, each side resampled on its own) runs only
  when asked, and is marked unpaired everywhere it is shown: its CI holds the examples' spread
  and it compares different example sets if the ids differ.
- Integrity rows (``must_match``) are examples whose value must be identical on both sides (an
  instrument check: an example both runs must score the same way). They are checked for exact
  equality and kept out of the read, where a forced zero difference would only pull it towards
  PARITY.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from levers.runs.metric_files import MetricColumn, MetricFileError
from levers.ab.stats import DifferenceCI, paired_difference_ci, unpaired_difference_ci
from levers.ab.verdict import difference_verdict

SCHEMA = "levers.compare/1"
BETTER = ("lower", "higher")


@dataclass(frozen=True)
class IntegrityRow:
    id: str
    baseline: float | None  # None: the id is missing from that file
    candidate: float | None
    matches: bool


@dataclass(frozen=True)
class Comparison:
    metric: str
    better: str  # "lower" or "higher"
    baseline_path: str
    candidate_path: str
    paired: bool
    num_baseline: int  # rows in each file
    num_candidate: int
    num_compared: int  # pairs in a paired read; rows of both sides in an unpaired one
    num_only_baseline: int  # ids in one file only
    num_only_candidate: int
    num_integrity_excluded: int
    baseline_mean: float  # over the examples the read uses
    candidate_mean: float
    ci: DifferenceCI
    verdict: str
    integrity: tuple[IntegrityRow, ...]
    notes: tuple[str, ...]

    @property
    def integrity_passed(self) -> bool | None:
        if not self.integrity:
            return None
        return all(row.matches for row in self.integrity)


def _integrity(
    base: dict[str, float], cand: dict[str, float], must_match: Sequence[str]
) -> tuple[IntegrityRow, ...]:
    rows = []
    for example in must_match:
        a, b = base.get(example), cand.get(example)
        rows.append(IntegrityRow(example, a, b, a is not None and b is not None and a == b))
    return tuple(rows)


def compare(
    baseline: MetricColumn,
    candidate: MetricColumn,
    *,
    better: str,
    unpaired: bool = False,
    must_match: Sequence[str] = (),
    num_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Comparison:
    """The read of one metric between two per-example files."""
    if better not in BETTER:
        raise ValueError(f"better must be one of {BETTER}, got {better!r}")
    if baseline.metric != candidate.metric:
        raise ValueError(f"metrics differ: {baseline.metric!r} and {candidate.metric!r}")
    base, cand = baseline.by_id(), candidate.by_id()
    excluded = set(must_match)
    common = [i for i in baseline.ids if i in cand and i not in excluded]
    only_base = sum(1 for i in baseline.ids if i not in cand)
    only_cand = sum(1 for i in candidate.ids if i not in base)
    notes = []
    if unpaired:
        a = [v for i, v in zip(baseline.ids, baseline.values) if i not in excluded]
        b = [v for i, v in zip(candidate.ids, candidate.values) if i not in excluded]
        ci = unpaired_difference_ci(
            a, b, num_resamples=num_resamples, seed=seed, confidence=confidence
        )
        num_compared = len(a) + len(b)
        notes.append(
            "UNPAIRED: each side's mean over all its rows, resampled on its own; the CI holds the "
            "examples' spread, and the example sets differ where ids are unmatched"
        )
    else:
        if len(common) < 2:
            raise MetricFileError(
                f"{baseline.path} and {candidate.path} share {len(common)} example id(s) "
                f"(outside the integrity rows); a paired read needs at least 2. Check that both "
                "evaluations ran on the same examples and wrote the same ids, or ask for "
                "--unpaired"
            )
        a, b = [base[i] for i in common], [cand[i] for i in common]
        ci = paired_difference_ci(
            a, b, num_resamples=num_resamples, seed=seed, confidence=confidence
        )
        num_compared = len(common)
    if only_base or only_cand:
        notes.append(
            f"{only_base} id(s) only in the baseline, {only_cand} only in the candidate"
            + ("" if unpaired else ": left out of the paired read")
        )
    integrity = _integrity(base, cand, must_match)
    return Comparison(
        metric=baseline.metric,
        better=better,
        baseline_path=baseline.path,
        candidate_path=candidate.path,
        paired=not unpaired,
        num_baseline=len(baseline.ids),
        num_candidate=len(candidate.ids),
        num_compared=num_compared,
        num_only_baseline=only_base,
        num_only_candidate=only_cand,
        num_integrity_excluded=sum(1 for i in excluded if i in base or i in cand),
        baseline_mean=sum(a) / len(a),
        candidate_mean=sum(b) / len(b),
        ci=ci,
        verdict=difference_verdict(ci.lo, ci.hi, better),
        integrity=integrity,
        notes=tuple(notes),
    )


def comparison_document(comparison: Comparison, options: dict[str, Any] | None = None) -> dict:
    """The comparison as one JSON-ready object: what ``--json`` writes and the record appends."""
    body = asdict(comparison)
    return {
        "schema_name": SCHEMA,
        "event": "compare",
        "options": options,
        **body,
        "integrity_passed": comparison.integrity_passed,
    }


def _fmt(value: float | None) -> str:
    return "missing" if value is None else f"{value:.6g}"


def _over(c: Comparison, num_rows: int) -> str:
    """The means are over the examples the read uses: say so when that is not every row."""
    if c.paired and c.num_compared != num_rows:
        return f" over the {c.num_compared} compared"
    return ""


def summary_lines(c: Comparison) -> list[str]:
    """The comparison as plain lines (terminal and Markdown share them)."""
    kind = "paired" if c.paired else "UNPAIRED"
    ci = c.ci
    lines = [
        f"metric {c.metric} ({c.better} is better), {kind} read over {c.num_compared} "
        + ("examples" if c.paired else "rows"),
        f"baseline {c.baseline_path}: {c.num_baseline} rows, mean {c.baseline_mean:.6g}"
        + _over(c, c.num_baseline),
        f"candidate {c.candidate_path}: {c.num_candidate} rows, mean {c.candidate_mean:.6g}"
        + _over(c, c.num_candidate),
        f"candidate - baseline: {ci.difference:+.6g}, CI{round(ci.confidence * 100)} "
        f"[{ci.lo:+.6g}, {ci.hi:+.6g}] ({ci.method}, {ci.num_resamples} resamples, "
        f"seed {ci.seed})",
        f"unmatched ids: {c.num_only_baseline} only in the baseline, {c.num_only_candidate} only "
        "in the candidate",
    ]
    if c.integrity:
        bad = [r for r in c.integrity if not r.matches]
        lines.append(
            f"integrity: {len(c.integrity) - len(bad)}/{len(c.integrity)} rows match exactly"
            + (" (kept out of the read)" if c.num_integrity_excluded else "")
        )
        for row in bad:
            lines.append(
                f"  MISMATCH id {row.id}: baseline {_fmt(row.baseline)}, candidate "
                f"{_fmt(row.candidate)}"
            )
    lines += [f"note: {n}" for n in c.notes]
    lines.append(f"verdict: {c.verdict}" + ("" if c.paired else " (unpaired)"))
    return lines


def to_markdown(c: Comparison) -> str:
    kind = "" if c.paired else " (UNPAIRED)"
    head = f"### levers compare: **{c.verdict}**{kind} on `{c.metric}`\n\n"
    return head + "\n".join(f"- {line}" for line in summary_lines(c)[:-1]) + "\n"
