"""Perplexity windows score only the last L_train bytes (stub models), retrieval scoring reads
the logits before each answer, and `pedsl eval / analyze` on a missing or corrupt run directory
fail with a diagnostic (exit 1, no traceback)."""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import F32_EPS
from compiler_helpers import run_cli as _cli
from pedsl.study.perplexity import perplexity, score_last, window_ends, windows_at
from pedsl.study.answers import score_answers


class PunishEarly:
    """logits (b, L, 256): uniform on the last ``keep`` positions; elsewhere all mass on byte 0
    (a huge loss for any other target), so scoring an early position shows up at once."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.calls: list[tuple[int, int]] = []

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        b, L = tokens.shape
        self.calls.append((b, L))
        logits = torch.zeros(b, L, 256)
        logits[:, : L - self.keep, 0] = 100.0
        return logits


def test_windows_of_every_length_end_at_the_same_bytes():
    data = torch.randint(1, 256, (5000,), dtype=torch.uint8)
    ends = window_ends(5000, 1024, 3, seed=7)
    assert torch.equal(ends, window_ends(5000, 1024, 3, seed=7))  # fixed seed
    prev = None
    for L in (64, 256, 1024):
        w = windows_at(data, ends, L)
        assert w.shape == (3, L + 1)
        assert torch.equal(w[:, -1], data[ends - 1].long())
        if prev is not None:
            assert torch.equal(w[:, -65:], prev[:, -65:])  # the scored tail is the same bytes
        prev = w


def test_only_the_last_training_length_is_scored():
    data = torch.randint(1, 256, (20000,), dtype=torch.uint8)  # byte 0 never occurs
    ctx = 32
    model = PunishEarly(keep=ctx)
    res = perplexity(model, data, [32, 64, 256, 1024], ctx, windows=3, seed=0, token_budget=600)
    for L, rec in res.items():
        # uniform on the scored bytes: float32's 256-term log-sum-exp, its log and the mean over at most the
        # 600 budgeted tokens; scoring one early position adds ~100 / 600
        assert rec["nll"] == pytest.approx(math.log(256), rel=(256 + 2 + 600) * F32_EPS, abs=0), L
        assert rec["ratio"] == pytest.approx(1.0)
        assert rec["tokens"] == 3 * ctx
    # batches stay within the token budget (one window at a time at 1024)
    assert all(b * L <= max(600, L) for b, L in model.calls)
    # a scorer that read earlier positions would see the 100-nat penalty
    total, count = score_last(PunishEarly(keep=8), windows_at(data, window_ends(20000, 64, 2, 0), 64), 32)
    assert total / count > 50


def test_ratio_reflects_longer_context():
    data = torch.randint(1, 256, (4000,), dtype=torch.uint8)

    class LengthHurts:
        def __call__(self, tokens):  # worse predictions the longer the input: ratio grows with L
            b, L = tokens.shape
            logits = torch.zeros(b, L, 256)
            logits[..., 0] = math.log(L)  # mass on a byte that never occurs
            return logits

    res = perplexity(LengthHurts(), data, [16, 64, 256], 16, windows=2)
    assert res["16"]["ratio"] == 1.0
    assert 1.0 < res["64"]["ratio"] < res["256"]["ratio"]


def test_retrieval_scores_the_logits_before_each_answer():
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10]])

    def copy_next(t):  # predicts token t + 1 at every position: exactly right for this sequence
        return torch.nn.functional.one_hot(t + 1, 256).float() * 50

    ok, nll = score_answers(copy_next, tokens, torch.tensor([[2, 5]]))
    assert ok.all() and (nll < 1e-6).all()

    def copy_same(t):
        return torch.nn.functional.one_hot(t, 256).float() * 50

    ok, _ = score_answers(copy_same, tokens, torch.tensor([[2, 5]]))
    assert not ok.any()


def test_blocks_score_the_same_letters_at_every_length():
    from pedsl.study.answers import blocks

    def oracle(t):  # copies the letter 15 back at block ends: exactly the task (offset 0, block 16)
        b, L = t.shape
        logits = torch.zeros(b, L, 256)
        prev = torch.roll(t, 14, dims=1)  # position p - 1 predicts t[p] = t[p - 15] = t[(p - 1) - 14]
        logits.scatter_(2, prev[..., None], 30.0)
        return logits

    res = blocks(oracle, [128, 256, 1024], 128, samples=3, block_len=16)
    assert all(r["accuracy"] == 1.0 for r in res.values())

    def by_letter(t):  # context-free: the loss depends only on which letters are scored
        return torch.nn.functional.one_hot(t, 256).float() * (t[..., None] % 7).float()

    res = blocks(by_letter, [128, 256, 1024], 128, samples=3, block_len=16)
    nll = {r["answer_nll"] for r in res.values()}
    assert len(nll) == 1 and all(r["answers"] == 3 * 8 for r in res.values())


@pytest.mark.parametrize("cmd", ["eval", "analyze"])
def test_missing_run_directory_is_a_clear_error(tmp_path, cmd, monkeypatch):
    monkeypatch.delenv("PEDSL_DEBUG", raising=False)
    code, _, err = _cli(cmd, str(tmp_path / "nope"))
    assert code == 1
    assert "does not exist" in err and "Traceback" not in err


def test_corrupt_run_directory_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("PEDSL_DEBUG", raising=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = _cli("eval", str(empty))
    assert code == 1 and "config.yaml" in err and "Traceback" not in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.yaml").write_text("steps: [unclosed\n")
    code, _, err = _cli("eval", str(bad))
    assert code == 1 and "Traceback" not in err and "error" in err
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = _cli("analyze", str(f))
    assert code == 1 and "not a run directory" in err


def test_bad_options_are_usage_errors(tmp_path):
    code, _, err = _cli("eval", str(tmp_path), "--tasks", "ppl,bogus")
    assert code == 2 and "bogus" in err
    code, _, err = _cli("eval", str(tmp_path), "--lengths", "128,abc")
    assert code == 1 and "abc" in err
