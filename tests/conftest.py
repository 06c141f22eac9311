"""Fixtures shared by the unit tests."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REAL_TRACES = REPO.parent / "shared" / "real-traces"


@pytest.fixture
def real_traces() -> Path:
    """Folder of real traces from other people's jobs; skips when ../shared is absent."""
    if not REAL_TRACES.is_dir():
        pytest.skip("../shared/real-traces is not here")
    return REAL_TRACES
