"""Catalogue rows from levers tune's own A/Bs: each lever tune added to a stack on a GPU, with the
tokens/s ratio and CI95 its A/B measured, becomes a row of ``levers list``'s catalogue.

``bench/tune_sweep.py`` keeps tune's record (``tune.record.jsonl``: one ``tune-trial`` event per
A/B) beside each session's rows (a session's folder, or ``SESSION.record.jsonl`` in the results
folder); every trial that adds one lever to a stack (``stack`` is
``base`` and one more lever) and ran to a ratio with a CI95 is a measurement of that lever on that
model, against that base. Per session, model, base and lever one row is kept: the confirming A/B
where tune ran one (a fresh A/B, not the one that selected the lever), else the selection. The
honest negatives stay: a lever tune measured slower and left out is a row that says so.

What a row says:

- ``lever`` the lever added, ``levers`` the whole stack it ran in (base and lever: tune reads
  single-lever rows only, so a row measured on top of compile informs ``levers list``, not
  tune's order); ``baseline`` ``<workload>:default`` for an empty base, else
  ``<workload>:lever:<base joined by +>``;
- ``shape`` the model and its factory parameters (the zoo's and the arch workload's full sizes);
- ``peak_allocated_delta_bytes`` the two sides' peaks apart (one measurement each: no CI95);
- ``note`` which A/B it is ("tune's confirming A/B" or "tune's selecting A/B") and the session;
- gpu, torch and levers' commit from the environment of the tune-result that ends the search,
  the date from the session's ``summary.json`` row of the model where it has one, else the day
  git first committed the session's record ("?" where neither is known);
- where the lever changed after the session measured it (:data:`SINCE`), the note says what.

A trial with an option form (``compile-model:mode=default``), one that replaced a lever in the
stack, one stopped by the budget or the kill line, or one that failed, gives no row.

    python bench/catalogue_from_tune.py bench/results/tune_sweep_h100 \
        --out bench/results/levers_catalogue_tune_h100/catalogue.json
    python -m levers.levers.catalogue   # the packaged copy (a test keeps the two equal)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from levers.output.atomic import atomic_write_text  # noqa: E402

ROLES = {"confirmation": "tune's confirming A/B (a fresh A/B after the one that selected it)",
         "selection": "tune's selecting A/B"}


# rows whose lever changed after the session measured it: what changed, said beside the figure
SINCE = {
    ("s61", "luke", "loss-valid-rows"): (
        "; measured before ac37d80, which pads the rows to a bucket: each batch's count of "
        "masked tokens was a new shape and a CUDA graph recorded for it"),
    ("s62", "luke", "loss-valid-rows"): (
        "; run on the tree of da0123c (the device's git read 1f86f26 with changes), before "
        "57dabf5, which finds the rows eagerly: traced, their count reached the compiled graphs "
        "as an input and the CUDA graphs still recorded one per batch"),
    ("s64", "squeezebert", "compile-blocks"): (
        "; it compiled nothing: SqueezeBERT's encoder calls each layer's forward by name, which "
        "skips the module call module.compile() compiles; since e646c95 the lever does not "
        "apply there"),
}


def _increment(trial: dict[str, Any]) -> str | None:
    """The lever a trial adds to its base, or None (a replacement, an option form, no base)."""
    base, stack = trial.get("base") or [], trial.get("stack") or []
    if len(stack) != len(base) + 1 or stack[:len(base)] != base:
        return None
    added = stack[-1]
    return None if ":" in added else added


def _measured(trial: dict[str, Any]) -> bool:
    ci = trial.get("tokens_per_s_ci95")
    return (trial.get("event") == "tune-trial" and trial.get("role") in ROLES
            and not trial.get("error") and not trial.get("killed")
            and trial.get("tokens_per_s_ratio") is not None and bool(ci) and None not in ci)


def _shape(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items() if k != "device")


def _committed(path: Path) -> str | None:
    """The date git first committed ``path`` (a session's record: the day it was measured), or
    None outside a checkout or for a file not committed yet."""
    try:
        done = subprocess.run(["git", "log", "--diff-filter=A", "--format=%cs", "-1", "--",
                               path.name], cwd=path.parent, capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _summary_dates(folder: Path) -> dict[str, str]:
    """model -> the date of its row in the session's summary.json files (where it has one)."""
    out: dict[str, str] = {}
    for path in folder.rglob("summary.json"):
        for row in json.loads(path.read_text(encoding="utf-8")).get("rows", []):
            model = (row.get("params") or {}).get("model")
            if model and row.get("date"):
                out[model] = row["date"]
    return out


def _trials(record: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each tune-trial of a record with the environment of the tune-result that ends its search
    (the GPU, torch and levers' commit that ran it)."""
    out, pending = [], []
    for line in record.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "tune-trial":
            pending.append(event)
        elif event.get("event") == "tune-result":
            env = event.get("environment") or {}
            out.extend((trial, env) for trial in pending
                       if trial.get("params") == event.get("params"))
            pending = []
    return out


def rows_of_session(folder: Path, session: str,
                    records: list[Path] | None = None) -> list[dict[str, Any]]:
    """The catalogue rows of one session: the folder's tune.record.jsonl files (at any depth),
    dated by the folder's summary.json files; or the ``records`` given, files of a folder that
    holds several sessions' rows, dated by the day each was committed."""
    dates = _summary_dates(folder) if records is None else {}
    chosen: dict[tuple, tuple[dict[str, Any], dict[str, Any]]] = {}
    for record in sorted(folder.rglob("tune.record.jsonl")) if records is None else records:
        committed = _committed(record)
        for trial, env in _trials(record):
            env = {**env, "committed": committed}
            lever = _increment(trial)
            if lever is None or not _measured(trial):
                continue
            params = trial.get("params") or {}
            key = (json.dumps(params, sort_keys=True), tuple(trial["base"]), lever)
            # the confirming A/B over the selecting one; of two of one role, the later
            if key in chosen and chosen[key][0]["role"] == "confirmation" != trial["role"]:
                continue
            chosen[key] = (trial, env)
    rows = []
    for (_, base, lever), (trial, env) in chosen.items():
        params = trial.get("params") or {}
        workload = trial.get("workload", "?")
        peaks = trial.get("peak_allocated_bytes") or [None, None]
        rows.append({
            "lever": lever,
            "levers": [*base, lever],
            "workload": workload,
            "shape": _shape(params),
            "baseline": f"{workload}:lever:{'+'.join(base)}" if base else f"{workload}:default",
            "status": "ok",
            "tokens_per_s_ratio": trial["tokens_per_s_ratio"],
            "tokens_per_s_ratio_ci95": list(trial["tokens_per_s_ci95"]),
            "peak_reserved_delta_bytes": None,
            "peak_allocated_delta_bytes": (float(peaks[1] - peaks[0])
                                           if None not in peaks else None),
            "peak_allocated_delta_ci95": None,
            "gpu": (env.get("gpu") or {}).get("name") or env.get("device_name") or "?",
            "torch": env.get("torch") or "?",
            "commit": env.get("levers_commit") or "?",
            "date": dates.get(params.get("model")) or env.get("committed") or "?",
            "error": None,
            "quality": None,
            "note": f"{ROLES[trial['role']]}, session {session}, parity {trial.get('parity')}"
                    + SINCE.get((session, params.get("model"), lever), ""),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path,
                        help="a tune_sweep results folder: a subfolder per session (its "
                             "tune.record.jsonl), or a SESSION.record.jsonl file per session")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"{args.results} is not a folder of tune_sweep sessions")
    rows = []
    for folder in sorted(p for p in args.results.iterdir() if p.is_dir()):
        rows.extend(rows_of_session(folder, folder.name))
    # a session kept as one record file beside the others (s36a.record.jsonl), its rows merged
    # into the folder's summary.json
    for record in sorted(args.results.glob("*.record.jsonl")):
        session = record.name.removesuffix(".record.jsonl")
        rows.extend(rows_of_session(args.results, session, [record]))
    if not rows:
        parser.error(f"no tune record under {args.results} adds a lever to a stack")
    doc = {"command": "bench/catalogue_from_tune.py " + " ".join(argv or sys.argv[1:]),
           "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
