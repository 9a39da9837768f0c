"""Shared fixtures: the scheme library and a fixed seed for every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ROOT / "schemes"

os.environ.setdefault("PEDSL_TEST", "1")


def library() -> list[Path]:
    return sorted(SCHEMES.glob("*.pe"))


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
