"""Per-example metric files: one value per example and metric, keyed by an example id.

Three formats, chosen by the file's suffix:

- ``.npz``: one array per metric and an id array (``id`` by default), all of one length;
- ``.jsonl``: one JSON object per line, each with the id and the metrics as keys;
- ``.csv``: a header row naming the id column and the metric columns.

Ids are compared as text (``7`` in a ``.npz`` and ``"7"`` in a ``.csv`` are the same example), so
one evaluation may be written in any of the formats. Every check a comparison depends on (the id
column exists, ids are unique, the metric is there and numeric and finite) runs when the file is
read, before any statistics.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from levers.errors import LeversError
from levers.text_files import read_utf8

SUFFIXES = (".npz", ".jsonl", ".csv")


class MetricFileError(LeversError):
    """A metric file cannot be read or does not hold what a comparison needs."""


@dataclass(frozen=True)
class MetricColumn:
    """One metric of one file: the ids in file order and the value of each."""

    path: str
    metric: str
    ids: tuple[str, ...]
    values: tuple[float, ...]

    def by_id(self) -> dict[str, float]:
        return dict(zip(self.ids, self.values, strict=True))


def _id_text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        raise MetricFileError(f"{where}: an id is a boolean ({value}); ids are names or integers")
    if isinstance(value, float):
        if not value.is_integer():
            raise MetricFileError(f"{where}: id {value!r} is a fraction; ids are names or integers")
        return str(int(value))
    if isinstance(value, (int, str)):
        return str(value)
    item = getattr(value, "item", None)  # numpy scalars
    if item is not None:
        return _id_text(item(), where)
    raise MetricFileError(
        f"{where}: id {value!r} is a {type(value).__name__}, not a name or integer",
    )


def _number(value: Any, where: str, metric: str, example: str) -> float:
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, (str, bytes)):
        value = item()
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MetricFileError(
            f"{where}: metric {metric!r} of example {example} is {value!r}, not a number"
        )
    try:
        number = float(value)
    except ValueError:
        raise MetricFileError(
            f"{where}: metric {metric!r} of example {example} is {value!r}, not a number"
        ) from None
    if not math.isfinite(number):
        raise MetricFileError(
            f"{where}: metric {metric!r} of example {example} is {number}; a comparison needs "
            "finite values: fix the evaluation or drop the example from both files"
        )
    return number


def _check_unique(ids: list[str], where: str, id_column: str) -> None:
    seen: set[str] = set()
    repeated = []
    for example in ids:
        if example in seen and example not in repeated:
            repeated.append(example)
        seen.add(example)
    if repeated:
        shown = ", ".join(repeated[:5]) + (" ..." if len(repeated) > 5 else "")
        raise MetricFileError(
            f"{where}: {len(repeated)} id(s) appear more than once in column {id_column!r} "
            f"({shown}); each example must have one row"
        )


def _read_npz(path: Path, metric: str, id_column: str) -> tuple[list[Any], list[Any]]:
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several kinds for a damaged archive
        raise MetricFileError(f"{path} is not a readable .npz archive: {exc}") from None
    with archive:
        names = list(archive.files)
        if id_column not in names:
            raise MetricFileError(
                f"{path} has no {id_column!r} array (arrays: {names}); save the example ids "
                f"beside the metrics (np.savez(..., {id_column}=ids, ...)) or name the id array "
                "with --id-column"
            )
        if metric not in names:
            others = [n for n in names if n != id_column]
            raise MetricFileError(f"{path} has no metric {metric!r}; its metrics: {others}")
        try:
            ids, values = archive[id_column], archive[metric]
        except ValueError as exc:  # an object array: numpy would have to unpickle it
            raise MetricFileError(
                f"{path}: {id_column!r} or {metric!r} is an array of Python objects ({exc}); "
                "levers does not unpickle files: save numbers (and ids as numbers or strings)"
            ) from None
        if ids.ndim != 1 or values.ndim != 1 or len(ids) != len(values):
            raise MetricFileError(
                f"{path}: {id_column!r} has shape {ids.shape} and {metric!r} {values.shape}; "
                "each must be one value per example, of one length"
            )
        if values.dtype.kind not in "biuf":
            raise MetricFileError(
                f"{path}: metric {metric!r} has dtype {values.dtype}, not a number"
            )
        return ids.tolist(), values.tolist()


def _read_jsonl(path: Path, metric: str, id_column: str) -> tuple[list[Any], list[Any]]:
    ids, values = [], []
    text = read_utf8(path, MetricFileError, bom=True)
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MetricFileError(f"{where} is not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise MetricFileError(f"{where} is not a JSON object with an id and metrics")
        if id_column not in row:
            raise MetricFileError(
                f"{where} has no {id_column!r} key (keys: {sorted(row)}); write each "
                "example's id, or name the id key with --id-column"
            )
        if metric not in row:
            raise MetricFileError(
                f"{where} has no metric {metric!r} (keys: {sorted(row)})"
            )
        ids.append(row[id_column])
        values.append(row[metric])
    return ids, values


def _read_csv(path: Path, metric: str, id_column: str) -> tuple[list[Any], list[Any]]:
    text = read_utf8(path, MetricFileError, bom=True)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    if id_column not in header:
        raise MetricFileError(
            f"{path} has no {id_column!r} column (columns: {header}); add one or name the "
            "id column with --id-column"
        )
    if metric not in header:
        others = [c for c in header if c != id_column]
        raise MetricFileError(f"{path} has no metric column {metric!r}; its metrics: {others}")
    rows = list(reader)
    return [r[id_column] for r in rows], [r[metric] for r in rows]


_READERS = {".npz": _read_npz, ".jsonl": _read_jsonl, ".csv": _read_csv}


def read_metric(path: str | Path, metric: str, *, id_column: str = "id") -> MetricColumn:
    """One metric of a per-example file, checked: unique ids, finite numbers."""
    path = Path(path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise MetricFileError(
            f"{path}: unknown format {path.suffix!r}; write per-example metrics as "
            f"{', '.join(SUFFIXES)}"
        )
    if not path.exists():
        raise MetricFileError(f"no metric file at {path}")
    if not path.is_file():
        raise MetricFileError(
            f"{path} is {_kind_of(path)}, not a file; levers reads each side's per-example "
            "metrics from a file on disk: write them to one and name it"
        )
    raw_ids, raw_values = reader(path, metric, id_column)
    if not raw_ids:
        raise MetricFileError(f"{path} holds no examples")
    where = str(path)
    ids = [_id_text(i, where) for i in raw_ids]
    _check_unique(ids, where, id_column)
    values = [_number(v, where, metric, e) for v, e in zip(raw_values, ids, strict=True)]
    return MetricColumn(where, metric, tuple(ids), tuple(values))


def _kind_of(path: Path) -> str:
    """What a path that exists but is not a regular file is, in words."""
    if path.is_dir():
        return "a directory"
    if path.is_fifo():
        return "a named pipe (FIFO)"
    if path.is_socket():
        return "a socket"
    if path.is_char_device() or path.is_block_device():
        return "a device"
    return "a special file"
