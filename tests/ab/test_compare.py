"""levers compare: closed-form answers on synthetic per-example files, verdicts, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from levers.runs.compare import compare
from levers.runs.metric_files import MetricColumn, MetricFileError, read_metric
from levers.ab.stats import paired_difference_ci
from levers.ab.verdict import DAMAGED, IMPROVED, PARITY
from levers.cli import main


def column(values, ids=None, path="x"):
    ids = ids if ids is not None else [str(i) for i in range(len(values))]
    return MetricColumn(path, "loss", tuple(ids), tuple(float(v) for v in values))


def run(capsys, *argv):
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- the statistics ------------------------------------------------------------------------


def test_a_constant_difference_gives_a_point_ci_at_that_difference():
    base = [1.0, 2.5, 4.0, 0.25, 8.0, 3.0, 5.5, 7.0]
    ci = paired_difference_ci(base, [b - 0.25 for b in base], num_resamples=500)
    assert (ci.difference, ci.lo, ci.hi) == (-0.25, -0.25, -0.25)


def test_the_point_estimate_is_the_mean_difference_and_the_ci_brackets_it():
    base = [0.0] * 8
    cand = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # mean 3.5
    ci = paired_difference_ci(base, cand, num_resamples=2000, seed=0)
    assert ci.difference == 3.5
    assert 0.0 < ci.lo < 3.5 < ci.hi < 7.0
    assert paired_difference_ci(base, cand, num_resamples=2000, seed=0) == ci  # seeded
    assert paired_difference_ci(base, cand, num_resamples=2000, seed=1) != ci


def test_pairing_removes_the_examples_own_spread():
    base = [float(v) for v in range(0, 200, 10)]  # examples differ a lot in difficulty
    cand = [b + (0.5 if i % 2 else 0.25) for i, b in enumerate(base)]  # mean +0.375
    paired = compare(column(base), column(cand), better="lower", num_resamples=2000)
    unpaired = compare(
        column(base),
        column(cand),
        better="lower",
        unpaired=True,
        num_resamples=2000,
    )
    assert paired.ci.difference == 0.375 and unpaired.ci.difference == 0.375
    assert 0.25 <= paired.ci.lo < 0.375 < paired.ci.hi <= 0.5
    assert paired.verdict == DAMAGED  # lower is better and the candidate is higher
    assert unpaired.verdict == PARITY and unpaired.ci.hi - unpaired.ci.lo > 10
    assert not unpaired.paired and unpaired.notes[0].startswith("UNPAIRED")


@pytest.mark.parametrize(
    ("shift", "better", "verdict"),
    [
        (-0.5, "lower", IMPROVED),
        (+0.5, "lower", DAMAGED),
        (+0.5, "higher", IMPROVED),
        (-0.5, "higher", DAMAGED),
        (0.0, "lower", PARITY),  # a point CI at 0 contains 0
    ],
)
def test_verdicts_follow_where_the_ci_lies_around_zero(shift, better, verdict):
    base = [1.0, 2.0, 3.0, 4.0]
    result = compare(
        column(base),
        column([b + shift for b in base]),
        better=better,
        num_resamples=200,
    )
    assert result.verdict == verdict


def test_a_noisy_zero_mean_difference_is_parity():
    base = [1.0] * 8
    cand = [1.5, 0.5, 1.5, 0.5, 1.5, 0.5, 1.5, 0.5]
    result = compare(column(base), column(cand), better="lower", num_resamples=1000)
    assert result.ci.difference == 0.0 and result.ci.lo < 0 < result.ci.hi
    assert result.verdict == PARITY


def test_only_shared_ids_are_paired_and_the_rest_are_counted():
    base = column([1.0, 2.0, 3.0, 4.0], ids=["a", "b", "c", "d"])
    cand = column([0.5, 1.5, 2.5, 9.0, 9.0], ids=["b", "a", "c", "x", "y"])
    result = compare(base, cand, better="lower", num_resamples=200)
    assert result.num_compared == 3  # a, b, c; each paired by id, not by position
    assert (result.baseline_mean, result.candidate_mean) == (2.0, 1.5)
    assert result.ci.difference == -0.5  # (1.5 - 1) + (0.5 - 2) + (2.5 - 3), over 3
    assert (result.num_only_baseline, result.num_only_candidate) == (1, 2)


def test_integrity_rows_must_match_exactly_and_stay_out_of_the_read():
    base = column([1.0, 2.0, 3.0, 4.0, 5.0], ids=["s1", "s2", "a", "b", "c"])
    cand = column([1.0, 2.0000001, 2.0, 3.0, 4.0], ids=["s1", "s2", "a", "b", "c"])
    result = compare(base, cand, better="lower", must_match=["s1", "s2", "zz"], num_resamples=200)
    assert [(r.id, r.matches) for r in result.integrity] == [("s1", True), ("s2", False), ("zz", False)]
    assert result.integrity_passed is False
    assert result.num_compared == 3 and (result.ci.lo, result.ci.hi) == (-1.0, -1.0)


def test_no_overlap_is_an_error_that_suggests_unpaired():
    with pytest.raises(MetricFileError, match="share 0 example id"):
        compare(
            column([1.0, 2.0], ids=["a", "b"]),
            column([1.0, 2.0], ids=["c", "d"]),
            better="lower",
        )


# ---- the files ----------------------------------------------------------------------------


def write_all_formats(tmp_path, name, ids, values):
    np.savez(
        tmp_path / f"{name}.npz",
        id=np.array(ids),
        loss=np.array(values),
        other=np.zeros(len(ids)),
    )
    with open(tmp_path / f"{name}.jsonl", "w") as f:
        for i, v in zip(ids, values):
            f.write(json.dumps({"id": i, "loss": v}) + "\n")
    with open(tmp_path / f"{name}.csv", "w") as f:
        f.write("id,loss\n" + "".join(f"{i},{v!r}\n" for i, v in zip(ids, values)))


@pytest.mark.parametrize("suffix", [".npz", ".jsonl", ".csv"])
def test_each_format_reads_the_same_column(tmp_path, suffix):
    write_all_formats(tmp_path, "b", [3, 1, 2], [0.5, 0.25, 0.125])
    col = read_metric(tmp_path / f"b{suffix}", "loss")
    assert col.ids == ("3", "1", "2") and col.values == (0.5, 0.25, 0.125)


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("name,loss\na,1\n", ".csv", "no 'id' column"),
        ("id,loss\na,1\na,2\n", ".csv", "appear more than once"),
        ("id,loss\na,1\nb,fast\n", ".csv", "'fast', not a number"),
        ("id,loss\na,1\nb,nan\n", ".csv", "is nan; a comparison needs finite values"),
        ('{"id": 1, "acc": 2}\n', ".jsonl", "no metric 'loss'"),
        ("id\tloss\n", ".tsv", "unknown format"),
    ],
)
def test_bad_files_are_refused_with_what_to_do(tmp_path, content, suffix, message):
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    with pytest.raises(MetricFileError, match=message):
        read_metric(path, "loss")


def test_an_npz_without_ids_or_with_text_metrics_is_refused(tmp_path):
    np.savez(tmp_path / "a.npz", loss=np.ones(3))
    with pytest.raises(MetricFileError, match="no 'id' array"):
        read_metric(tmp_path / "a.npz", "loss")
    np.savez(tmp_path / "b.npz", id=np.arange(2), loss=np.array(["x", "y"]))
    with pytest.raises(MetricFileError, match="not a number"):
        read_metric(tmp_path / "b.npz", "loss")


# ---- the command --------------------------------------------------------------------------


def test_the_command_across_formats_writes_json_and_markdown(capsys, tmp_path):
    ids = list(range(16))
    base = [1.0 + i for i in ids]
    write_all_formats(tmp_path, "base", ids, base)
    write_all_formats(tmp_path, "cand", ids, [b - 0.5 for b in base])
    code, out, err = run(
        capsys, str(tmp_path / "base.npz"), str(tmp_path / "cand.csv"), "--metric", "loss",
        "--resamples", "300", "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md"),
    )
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["verdict"] == IMPROVED and doc["paired"] is True
    assert (doc["ci"]["lo"], doc["ci"]["hi"], doc["ci"]["num_resamples"]) == (-0.5, -0.5, 300)
    assert "verdict: IMPROVED" in out
    assert (tmp_path / "r.md").read_text().startswith("### levers compare: **IMPROVED**")


def test_the_command_exits_1_when_an_integrity_row_differs(capsys, tmp_path):
    write_all_formats(tmp_path, "base", [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    write_all_formats(tmp_path, "cand", [1, 2, 3, 4], [1.5, 2.0, 3.0, 4.5])
    code, out, _ = run(
        capsys, str(tmp_path / "base.jsonl"), str(tmp_path / "cand.jsonl"), "--metric", "loss",
        "--must-match", "1,2", "--resamples", "200", "--higher-is-better",
    )
    assert code == 1
    assert "MISMATCH id 1: baseline 1, candidate 1.5" in out


def test_the_command_refuses_bad_input_before_any_work(capsys, tmp_path):
    (tmp_path / "a.csv").write_text("id,loss\n1,1\n1,2\n")
    (tmp_path / "b.csv").write_text("id,loss\n1,1\n")
    code, _, err = run(capsys, str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--metric", "loss")
    assert code == 2 and "more than once" in err
