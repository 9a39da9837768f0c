"""The RULER-style retrieval generators (pedsl.data.tasks): every row is exactly the asked length,
the asked needle starts exactly at the asked depth, the answer is the needle's value (found by
searching the text, independently of the generator's bookkeeping), a model that copies the right
span scores 100% and a constant guesser scores chance - by construction, no training."""

from __future__ import annotations

import re

import pytest
import torch

from pedsl.data import tasks
from pedsl.data.stream import make_generator
from pedsl.errors import DataError
from pedsl.study.answers import score_answers


def _text(row: torch.Tensor) -> str:
    return bytes(row.tolist()).decode("ascii")


def _answer_by_search(task: str, text: str) -> tuple[int, str]:
    """(start of the asked needle, its value) found by reading the text like a person would."""
    if task == "passkey":
        m = re.search(r"The pass key is (\d+)\. ", text)
        return m.start(), m.group(1)
    if task == "multikey":
        name = re.search(r"The key of ([a-z]{3}) is \d+$", text).group(1)
        hits = [m for m in re.finditer(r"The key of ([a-z]{3}) is (\d+)\. ", text) if m.group(1) == name]
        assert len(hits) == 1, "the asked name occurs in exactly one needle"
        return hits[0].start(), hits[0].group(2)
    key = re.search(r"\| ([a-z]{4})=\d+$", text).group(1)
    hits = [m for m in re.finditer(r"([a-z]{4})=(\d+); ", text) if m.group(1) == key]
    assert len(hits) == 1
    return hits[0].start(), hits[0].group(2)


@pytest.mark.parametrize("task", tasks.TASKS)
@pytest.mark.parametrize("length", [tasks.min_length("multikey"), 517])
@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_answer_is_where_it_says_at_the_exact_depth_and_length(task, length, depth):
    b = tasks.generate(task, 6, length, depth=depth, g=make_generator(7, length))
    assert b["tokens"].shape == (6, length) and b["tokens"].dtype == torch.long
    digits = b["answer_positions"].shape[1]
    assert digits == 5 and torch.equal(b["answer_positions"][0], torch.arange(length - 5, length))
    for i in range(6):
        text = _text(b["tokens"][i])
        start, value = _answer_by_search(task, text)
        assert text.endswith(value)
        assert start == int(b["needle_positions"][i])
        src = b["source_positions"][i]
        assert _text(b["tokens"][i, src]) == value
        assert torch.equal(b["tokens"][i, src], b["tokens"][i, b["answer_positions"][i]])
        if task == "kv":
            width = 12
            pairs = (length - len(tasks.KV_QUESTION) - 10) // width
            pad = length - len(tasks.KV_QUESTION) - 10 - pairs * width
            assert start == pad + round(depth * (pairs - 1)) * width
        else:
            tail = len(text) - text.rindex(" What is" if task == "passkey" else " The key of")
            needle = len(re.match(r"The (pass )?key (of [a-z]{3} )?is \d+\. ", text[start:]).group(0))
            assert start == round(depth * (length - tail - needle))
    if task == "multikey":  # the distractors are there, with other names
        assert all(len(re.findall(r"The key of [a-z]{3} is \d+\. ", _text(r))) == 3 for r in b["tokens"])


@pytest.mark.parametrize("task", tasks.TASKS)
def test_random_depths_cover_the_haystack_and_are_reproducible(task):
    a = tasks.generate(task, 64, 300, g=make_generator(1))
    b = tasks.generate(task, 64, 300, g=make_generator(1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    d = a["depth"]
    assert 0 <= float(d.min()) < 0.2 and 0.8 < float(d.max()) <= 1


def _copier(batch):
    """A 'model' whose logits at p - 1 put all mass on the byte at the answer's source span."""
    def model(tokens):
        logits = torch.zeros(*tokens.shape, 256)
        rows = torch.arange(tokens.shape[0])[:, None]
        logits[rows, batch["answer_positions"] - 1, tokens[rows, batch["source_positions"]]] = 30.0
        return logits
    return model


def _constant(tokens):
    logits = torch.zeros(*tokens.shape, 256)
    logits[..., ord("3")] = 10.0
    return logits


@pytest.mark.parametrize("task", tasks.TASKS)
def test_copier_scores_everything_and_a_constant_guess_scores_chance(task):
    b = tasks.generate(task, 400, 160, g=make_generator(3, task))
    ok, nll = score_answers(_copier(b), b["tokens"], b["answer_positions"], token_budget=10**6)
    assert bool(ok.all()) and float(nll.max()) < 1e-3
    ok, _ = score_answers(_constant, b["tokens"], b["answer_positions"])
    assert abs(float(ok.float().mean()) - tasks.DIGIT_CHANCE) < 0.03  # 2000 uniform digits: sd 0.007
    assert float(ok.all(-1).float().mean()) < 0.01                      # whole answers: chance 1e-5


@pytest.mark.parametrize("task", tasks.TASKS)
def test_too_short_or_bad_depth_is_a_data_error(task):
    L = tasks.min_length(task)
    tasks.generate(task, 2, L, depth=1.0, g=make_generator(0))
    with pytest.raises(DataError, match="too short"):
        tasks.generate(task, 1, L - 1, depth=0.5, g=make_generator(0))
    with pytest.raises(DataError, match="depth"):
        tasks.generate(task, 1, 400, depth=1.5, g=make_generator(0))
    with pytest.raises(DataError, match="unknown retrieval task"):
        tasks.generate("passkee", 1, 400, g=make_generator(0))


def _reader(tokens):
    """A 'model' that reads each row like a person (regex search) and predicts the asked value."""
    logits = torch.zeros(*tokens.shape, 256)
    for r, row in enumerate(tokens):
        text = _text(row)
        task = "passkey" if "What is the pass key?" in text else "kv" if "| " in text[-15:] else "multikey"
        _, value = _answer_by_search(task, text)
        L = len(text)
        for n, ch in enumerate(value):
            logits[r, L - len(value) + n - 1, ord(ch)] = 30.0
    return logits


def test_evaluate_retrieval_aggregates_by_task_length_and_depth():
    from pedsl.study.retrieval.score import evaluate_retrieval

    lengths = [100, tasks.min_length("multikey"), 300]
    r = evaluate_retrieval(_reader, lengths, depths=(0.0, 0.5, 1.0), samples=3)
    assert set(r["tasks"]) == set(tasks.TASKS)
    assert "100" not in r["tasks"]["multikey"] and "100" in r["tasks"]["kv"]  # too short for 3 keys: skipped
    for task, per_len in r["tasks"].items():
        for rec in per_len.values():
            assert rec["accuracy"] == 1.0 and set(rec["depths"]) == {"0", "0.5", "1"}
    assert r["overall"]["300"]["accuracy"] == 1.0
    const = evaluate_retrieval(_constant, [300], depths=(0.5,), samples=40)
    assert const["overall"]["300"]["accuracy"] == 0.0
    assert abs(const["overall"]["300"]["digit_accuracy"] - tasks.DIGIT_CHANCE) < 0.06


@pytest.mark.parametrize("length", [tasks.min_length("kv", queries=4), 129, 517])
def test_kv_with_several_queries_asks_distinct_pairs_and_keeps_depth_and_length(length):
    b = tasks.kv(5, length, depth=0.5, queries=4, g=make_generator(11, length))
    assert b["tokens"].shape == (5, length)
    width, qwidth = 12, len(tasks.KV_QUESTION) + 10
    pairs = (length - 4 * qwidth) // width
    pad = length - 4 * qwidth - pairs * width
    for i in range(5):
        text = _text(b["tokens"][i])
        asked = re.findall(r"\| ([a-z]{4})=(\d{5})", text)
        assert len(asked) == 4 and len({k for k, _ in asked}) == 4  # distinct pairs, the last one scored
        hay = dict(re.findall(r"([a-z]{4})=(\d{5}); ", text))
        assert len(hay) == pairs and all(hay[k] == v for k, v in asked)  # every query copies its pair
        assert int(b["needle_positions"][i]) == pad + round(0.5 * (pairs - 1)) * width
        assert text.endswith(asked[-1][0] + "=" + asked[-1][1])
        assert _text(b["tokens"][i, b["source_positions"][i]]) == asked[-1][1]
    with pytest.raises(DataError, match="too short"):
        tasks.kv(1, tasks.min_length("kv", queries=4) - 1, queries=4, g=make_generator(0))
    with pytest.raises(DataError, match="query"):
        tasks.kv(1, 200, queries=0, g=make_generator(0))
