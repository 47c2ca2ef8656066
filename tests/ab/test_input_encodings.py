"""User files that are not UTF-8 text, or that hold pickled objects, are refused with exit 2 and
what to do, never reported as levers' own failure (exit 70); a UTF-8 byte-order mark is read
(defect N7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from levers.cli import main
from levers.runs.metric_files import MetricFileError, read_metric

GOOD = "id,loss\n1,0.5\n2,0.25\n3,0.75\n"


def _csv(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


def test_a_latin1_metric_file_is_refused_with_exit_2(tmp_path, capsys):
    a = _csv(tmp_path / "a.csv", GOOD)
    b = _csv(tmp_path / "b.csv", "id,loss,note\n1,0.5,é\n2,0.25,ü\n3,0.75,x\n", "latin-1")
    assert main(["compare", str(a), str(b), "--metric", "loss"]) == 2
    err = capsys.readouterr().err
    assert "is not UTF-8 text" in err and "save it as UTF-8" in err


def test_a_binary_file_named_csv_is_refused_with_exit_2(tmp_path, capsys):
    a = _csv(tmp_path / "a.csv", GOOD)
    b = tmp_path / "bin.csv"
    b.write_bytes(bytes(range(256)))
    assert main(["compare", str(a), str(b), "--metric", "loss"]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


def test_an_npz_of_python_objects_is_refused_not_unpickled(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, id=np.array([1, 2, 3]), loss=np.array([1, "a", None], dtype=object))
    with pytest.raises(MetricFileError, match="array of Python objects"):
        read_metric(path, "loss")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_utf8_byte_order_mark_is_read(tmp_path, suffix):
    text = GOOD if suffix == ".csv" else "".join(
        f'{{"id": {i}, "loss": {v}}}\n' for i, v in ((1, 0.5), (2, 0.25), (3, 0.75))
    )
    path = tmp_path / f"excel{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    column = read_metric(path, "loss")
    assert column.ids == ("1", "2", "3") and column.values == (0.5, 0.25, 0.75)


def test_a_pre_registration_that_is_not_utf8_is_refused_with_exit_2(tmp_path, capsys):
    prereg = tmp_path / "r_latin.toml"
    prereg.write_bytes(b"\xff\xfe" + "title = 'x'\n".encode("utf-16-le"))
    assert main(["prereg", "freeze", str(prereg)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


def test_a_run_guard_from_a_non_utf8_pre_registration_says_what_to_do(tmp_path):
    import levers
    from levers.errors import LeversError

    prereg = tmp_path / "r_latin.toml"
    prereg.write_bytes(b"\xff\xfe" + "title = 'x'\n".encode("utf-16-le"))
    with pytest.raises(LeversError, match="is not UTF-8 text"):
        levers.RunGuard.from_prereg(prereg)
