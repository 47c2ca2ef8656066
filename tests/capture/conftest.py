import pathlib

import pytest

_FIXTURE = pathlib.Path(__file__).with_name("fixture_models.py")


@pytest.fixture(scope="session")
def mark_line():
    """Line number of the ``# mark: NAME`` comment in fixture_models.py."""
    lines = _FIXTURE.read_text().splitlines()

    def find(name: str) -> int:
        hits = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# mark: {name}")]
        assert len(hits) == 1, f"mark {name!r} found {len(hits)} times"
        return hits[0]

    return find
