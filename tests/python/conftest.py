"""The Python module's tests (ctest `python`; or PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python):
the fast bundled models, the checkout's example photos, and ../shared when it is beside the checkout."""
import os
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")  # no display: figures are drawn into buffers

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo():
    return REPO


@pytest.fixture(scope="session")
def shared():
    return SHARED


@pytest.fixture(scope="session")
def synth():
    import sat
    return sat.Captioner(REPO / "models" / "synth.sat")


@pytest.fixture(scope="session")
def inception():
    import sat
    return sat.Captioner(REPO / "models" / "flickr8k-inception.sat")


@pytest.fixture(scope="session")
def sat_bin():
    path = os.environ.get("SAT_BIN")
    if not path:
        pytest.skip("SAT_BIN (the sat command, set by ctest) is not set")
    return path
