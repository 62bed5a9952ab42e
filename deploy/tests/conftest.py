"""Shared set-up of the deploy/ tests: the slicetrain binary under test and the adapter on sys.path.

SLICETRAIN_BIN names the binary (ctest passes $<TARGET_FILE:slicetrain>); without it the tests
that need the binary are skipped, unless CI=true, where they fail.
"""

import os
import sys

import pytest

DEPLOY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(DEPLOY)
sys.path.insert(0, os.path.join(DEPLOY, "ray"))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def slicetrain_bin() -> str:
    path = os.environ.get("SLICETRAIN_BIN", "")
    if not path or not os.access(path, os.X_OK):
        msg = f"SLICETRAIN_BIN={path!r} is not an executable slicetrain binary"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return path
