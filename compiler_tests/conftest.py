"""Shared fixtures: the scheme library and a fixed seed for every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("PEDSL_TEST", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: one thread each (and in every subprocess they start), or the
    # workers oversubscribe the cores and torch's thread pools slow each other down many-fold.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass

# After the thread settings above: compiler_helpers imports torch.
from compiler_helpers import ROOT, SCHEMES, library  # noqa: E402,F401 - also importable from conftest


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module of tiny-tensor tests: more threads only add contention on a
    shared machine. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def schemes_dir() -> Path:
    return SCHEMES


@pytest.fixture(autouse=True)
def _seed():
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    torch.manual_seed(0)
    yield
