"""The measured catalogue behind ``levers list``: each lever's effect, read from committed results.

The catalogue file is written by ``bench/levers_vs_peers.py`` on a GPU and committed under
``bench/results/levers_catalogue_<gpu>/catalogue.json``. Each row is one lever (or a stack of
levers) measured against a baseline at one workload and shape:

    {"lever": "compile-blocks", "levers": ["compile-blocks"], "workload": "hf",
     "shape": "arch=llama size=1b batch_size=4 seq_len=2048", "baseline": "hf-default",
     "tokens_per_s_ratio": 1.5, "tokens_per_s_ratio_ci95": [1.49, 1.51],
     "peak_reserved_delta_bytes": -1.2e9, "peak_allocated_delta_bytes": ...,
     "peak_allocated_delta_ci95": [lo, hi], "status": "ok" | "failed", "error": null,
     "gpu": ..., "torch": ..., "commit": ..., "date": ...}

A ratio whose CI95 contains 1 is "no effect"; below 1 is "slower". Both are shown, never hidden.

The activation-checkpointing levers are measured by ``bench/ac_policies.py`` instead, whose
``bench/results/ac_policies_<gpu>/summary.json`` (one row per policy, batch and budget, with
``meta.json`` beside it) is read too (:func:`ac_policy_rows`): each lever row becomes a
measurement against ``none`` at the same batch, its ratio's CI95 from the two CI95s (the
lever's low over none's high, and high over low), its peak change the difference of the two
peak-allocated figures. Peers (``torchtitan-op-sac``) are not levers and are skipped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers.output.atomic import atomic_write_text

ENV = "LEVERS_CATALOGUE"
_REPO_RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"
# the same rows shipped inside the package, for an installation without the repository's bench/
# results beside it (pip install . or a wheel); written by write_packaged(), kept equal to the
# repository's by a test
PACKAGED = Path(__file__).resolve().parent / "measured.json"


@dataclass(frozen=True)
class Measurement:
    lever: str
    levers: tuple[str, ...]
    workload: str
    shape: str
    baseline: str
    status: str  # "ok" or "failed"
    tokens_per_s_ratio: float | None
    tokens_per_s_ratio_ci95: tuple[float, float] | None
    peak_reserved_delta_bytes: float | None
    peak_allocated_delta_bytes: float | None
    peak_allocated_delta_ci95: tuple[float, float] | None
    gpu: str
    torch: str
    commit: str
    date: str
    error: str | None = None
    # a numerics-changing lever's quality read ("held-out loss over 500 steps: ... PARITY")
    quality: str | None = None
    # what the row's reader must know (a step time that was not measured alone, say)
    note: str | None = None

    @property
    def effect(self) -> str:
        """"faster", "slower", "no effect" (CI95 holds 1), "not timed" (a memory or quality
        row) or "failed"."""
        if self.status != "ok":
            return "failed"
        if self.tokens_per_s_ratio is None:
            return "not timed"
        if self.tokens_per_s_ratio_ci95 is None:
            return "failed"
        low, high = self.tokens_per_s_ratio_ci95
        if low > 1.0:
            return "faster"
        if high < 1.0:
            return "slower"
        return "no effect"

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["levers"] = list(self.levers)
        out["effect"] = self.effect
        return out


AC_LEVERS = ("ac-full", "ac-selective", "ac-budget")


def catalogue_paths(explicit: str | os.PathLike | None = None) -> list[Path]:
    """The catalogue files to read: the one named, else $LEVERS_CATALOGUE, else the repo's
    (``levers_catalogue_*/catalogue.json`` and ``ac_policies_*/summary.json``)."""
    if explicit is not None:
        return [Path(explicit)]
    if os.environ.get(ENV):
        return [Path(os.environ[ENV])]
    repo = repository_paths()
    return repo if repo else [PACKAGED]


def repository_paths() -> list[Path]:
    """The repository's result files, where the package runs from a checkout (else none)."""
    return sorted(_REPO_RESULTS.glob("levers_catalogue_*/catalogue.json")) + sorted(
        _REPO_RESULTS.glob("ac_policies_*/summary.json")
    )


def packaged_document(rows: list[Measurement]) -> dict[str, Any]:
    """The packaged catalogue's content: every row, in the order read."""
    return {"rows": [row.to_dict() for row in rows]}


def write_packaged() -> Path:
    """Write the repository's rows into the package (``python -m levers.levers.catalogue``
    after a benchmark adds results)."""
    rows = [row for path in repository_paths() for row in read_catalogue(path)]
    atomic_write_text(PACKAGED, json.dumps(packaged_document(rows), indent=1) + "\n")
    return PACKAGED


def ac_policy_rows(path: Path) -> list[Measurement]:
    """Measurements of the checkpointing levers from ``bench/ac_policies.py``'s summary."""
    rows = json.loads(path.read_text(encoding="utf-8"))
    meta_path = path.with_name("meta.json")
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    base = {r["batch_size"]: r for r in rows if r["policy"] == "none" and r.get("tokens_per_s")}
    out = []
    for row in rows:
        if row["policy"] not in AC_LEVERS or row["batch_size"] not in base:
            continue
        none = base[row["batch_size"]]
        shape = (
            f"arch={meta.get('arch', '?')} size={meta.get('size', '?')} "
            f"batch_size={row['batch_size']} seq_len={meta.get('seq_len', '?')}"
        )
        if row.get("budget_bytes"):
            shape += f" budget={row['budget_bytes'] / 2**30:.2f}GiB"
        ok = bool(row.get("tokens_per_s")) and not row.get("error")
        ratio = ci95 = delta = None
        if ok:
            ratio = row["tokens_per_s"] / none["tokens_per_s"]
            (low, high), (none_low, none_high) = row["tokens_per_s_ci95"], none["tokens_per_s_ci95"]
            ci95 = (low / none_high, high / none_low)
            if row.get("peak_allocated_bytes") and none.get("peak_allocated_bytes"):
                delta = float(row["peak_allocated_bytes"] - none["peak_allocated_bytes"])
        out.append(
            Measurement(
                lever=row["policy"],
                levers=(row["policy"],),
                workload=meta.get("workload", "hf"),
                shape=shape,
                baseline="none",
                status="ok" if ok else "failed",
                tokens_per_s_ratio=ratio,
                tokens_per_s_ratio_ci95=ci95,
                peak_reserved_delta_bytes=None,
                peak_allocated_delta_bytes=delta,
                peak_allocated_delta_ci95=None,
                gpu=row.get("gpu", meta.get("gpu", "?")),
                torch=row.get("torch", meta.get("torch", "?")),
                commit=row.get("commit", meta.get("commit", "?")),
                date=row.get("date", meta.get("date", "?")),
                error=row.get("error"),
            )
        )
    return out


def _pair(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    low, high = value
    return float(low), float(high)


def read_catalogue(explicit: str | os.PathLike | None = None) -> list[Measurement]:
    rows: list[Measurement] = []
    for path in catalogue_paths(explicit):
        if not path.exists():
            raise FileNotFoundError(f"no catalogue at {path}; bench/levers_vs_peers.py writes one")
        if path.name == "summary.json":  # bench/ac_policies.py's rows
            rows.extend(ac_policy_rows(path))
            continue
        doc = json.loads(path.read_text(encoding="utf-8"))
        for row in doc.get("rows", []):
            rows.append(
                Measurement(
                    lever=row["lever"],
                    levers=tuple(row.get("levers", [row["lever"]])),
                    workload=row.get("workload", "?"),
                    shape=row.get("shape", "?"),
                    baseline=row.get("baseline", "?"),
                    status=row.get("status", "ok"),
                    tokens_per_s_ratio=row.get("tokens_per_s_ratio"),
                    tokens_per_s_ratio_ci95=_pair(row.get("tokens_per_s_ratio_ci95")),
                    peak_reserved_delta_bytes=row.get("peak_reserved_delta_bytes"),
                    peak_allocated_delta_bytes=row.get("peak_allocated_delta_bytes"),
                    peak_allocated_delta_ci95=_pair(row.get("peak_allocated_delta_ci95")),
                    gpu=row.get("gpu", doc.get("gpu", "?")),
                    torch=row.get("torch", doc.get("torch", "?")),
                    commit=row.get("commit", doc.get("commit", "?")),
                    date=row.get("date", doc.get("date", "?")),
                    error=row.get("error"),
                    quality=row.get("quality"),
                    note=row.get("note"),
                )
            )
    return rows


def measurements_by_lever(rows: list[Measurement]) -> dict[str, list[Measurement]]:
    out: dict[str, list[Measurement]] = {}
    for row in rows:
        out.setdefault(row.lever, []).append(row)
    return out


if __name__ == "__main__":
    print(f"wrote {write_packaged()}")
