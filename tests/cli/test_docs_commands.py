"""Every ``levers ...`` command in a code block of README.md and docs/*.md runs as printed.

The commands are collected from the fenced code blocks; a synopsis (``[OPTIONS]``, ``A|B``,
upper-case placeholders) is not a command. What cannot run on the README's CPU set-up is listed
in ``NOT_RUN`` with the reason, so a new example is run unless someone says why not.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# command (as collected) -> why it is not run here
NOT_RUN = {
    "levers audit -- python train.py --lr 3e-4 --batch-size 8": "an example of a user's own script",
    "levers audit --html report.html --trace step.json -- python -m mypkg.train":
        "an example of a user's own package",
    "levers compare evals/40k.npz evals/60k.npz --metric chunk_mae --lower-is-better "
    "--must-match 3,11 --json read1.json --md read1.md":
        "an example of a user's own evaluation files",
    "levers ab hf --set size=1b --lever compile-blocks,fused-linear-cross-entropy,raise-batch":
        "needs a GPU (raise-batch refuses on a CPU; a 1b model)",
    "levers audit calls": "prose in the README's source layout, not a command",
    "levers memory llama --set size=8b --gpu h100-80gb": "an 8b model: tens of seconds (docs/memory.md times it)",
}
# what a command exits with when that is its point (--fail-on gates on findings)
EXPECTED_EXIT = {"levers audit demo --select ATTN,NORM001 --ignore MEM002 --fail-on medium": 1}
# commands that run one after the other in one directory, in this order
SEQUENCES = ("levers prereg ",)


def _commands() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.strip().removeprefix("$ ").strip()
                if not line.startswith("levers ") or _is_synopsis(line):
                    continue
                command = _without_comment(line)
                found.append((path.relative_to(ROOT).as_posix(), command))
    return found


def _is_synopsis(line: str) -> bool:
    command = line.split("#", 1)[0]
    return "[" in command or "|" in command or any(
        re.fullmatch(r"[A-Z_]+", word) for word in command.split()
    )


def _without_comment(line: str) -> str:
    words = shlex.split(line, comments=True)
    return " ".join(shlex.quote(w) for w in words)


COMMANDS = _commands()


def test_the_docs_have_commands_to_run():
    assert len(COMMANDS) >= 8


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command)[1:]
    return subprocess.run(
        [sys.executable, "-m", "levers", *argv], cwd=cwd, capture_output=True, text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "where,command",
    [c for c in COMMANDS if c[1] not in NOT_RUN and not c[1].startswith(SEQUENCES)],
    ids=lambda value: value,
)
def test_a_docs_command_runs_as_printed(where, command, tmp_path):
    import importlib.util

    # the Hugging Face workloads need transformers (the test extra installs it)
    if re.search(r"\b(hf|zoo)\b", command) and importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers, which is not installed")
    cwd = ROOT if "tests/" in command else tmp_path
    done = _run(command, cwd)
    assert done.returncode == EXPECTED_EXIT.get(command, 0), (where, done.stderr[-2000:])


def test_the_prereg_sequence_runs_as_printed(tmp_path):
    sequence = [c for _, c in COMMANDS if c.startswith(SEQUENCES)]
    assert sequence, "docs/guards.md shows the prereg commands"
    for command in sequence:
        done = _run(command, tmp_path)
        assert done.returncode == 0, (command, done.stderr[-2000:])


def test_every_command_not_run_is_still_in_the_docs():
    collected = {c for _, c in COMMANDS}
    assert set(NOT_RUN) <= collected, set(NOT_RUN) - collected
