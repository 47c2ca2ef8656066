"""levers.output.errors: what a user sees when something goes wrong."""

from __future__ import annotations

import io

from rich.console import Console

from levers.errors import FactoryError, WorkloadNotFound
from levers.output.errors import debug_from_env, print_error, print_internal_error


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=40, color_system=None, soft_wrap=True), out


def test_print_error_message_only():
    console, out = _console()
    print_error(WorkloadNotFound("unknown workload 'x' [try demo]"), console)
    # markup-like text in a message is printed as is, and long lines are not wrapped
    assert out.getvalue() == "levers: error: unknown workload 'x' [try demo]\n"


def test_print_error_with_user_traceback():
    console, out = _console()
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/a/very/long/path/to/the/users/train.py", line 3, in factory\n'
        "    raise RuntimeError('boom')\n"
        "RuntimeError: boom"
    )
    print_error(FactoryError("the factory raised RuntimeError: boom", user_traceback=tb), console)
    assert out.getvalue() == "levers: error: the factory raised RuntimeError: boom\n" + tb + "\n"


def test_internal_error_without_debug_has_no_traceback():
    console, out = _console()
    try:
        raise KeyError("op_index")
    except KeyError as exc:
        print_internal_error(exc, debug=False, console=console)
    text = out.getvalue()
    assert text.startswith("levers: internal error: KeyError: 'op_index'\n")
    assert "please report it" in text
    assert "--debug (or LEVERS_DEBUG=1)" in text
    assert "Traceback" not in text


def test_internal_error_with_debug_shows_traceback():
    console, out = _console()
    try:
        raise KeyError("op_index")
    except KeyError as exc:
        print_internal_error(exc, debug=True, console=console)
    text = out.getvalue()
    assert text.startswith("Traceback (most recent call last):\n")
    assert "test_internal_error_with_debug_shows_traceback" in text
    assert "levers: internal error: KeyError: 'op_index'" in text


def test_debug_from_env(monkeypatch):
    monkeypatch.delenv("LEVERS_DEBUG", raising=False)
    assert not debug_from_env()
    for value, expected in (
        ("1", True),
        ("yes", True),
        ("0", False),
        ("", False),
        ("false", False),
    ):
        monkeypatch.setenv("LEVERS_DEBUG", value)
        assert debug_from_env() is expected
