"""The counting tasks (pedsl.data.counting) and their training stream: every answer re-derived by a
naive parser of the bytes, determinism, segments of variable length (no fixed token distance finds
the answer), the stretch, and the diagnostics of bad sizes."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from compiler_helpers import run_cli
from pedsl.config import DataConfig
from pedsl.data import counting
from pedsl.data.stream import TrainData, make_generator, parse_mixture
from pedsl.errors import DataError

Q, W, DOT, SP = ord("?"), ord("#"), ord("."), ord(" ")


def _upper(b: int) -> bool:
    return ord("A") <= b <= ord("Z")


def naive_answers(task: str, row: list[int]) -> dict[int, tuple[int, int]]:
    """{answer position: (k, source position)} read off the bytes alone: a query is '?' then the
    digit k then the answer; for select_last the source is the byte after the k-th last '#' before
    the query, for sentence_first the first letter of the k-th last sentence (an uppercase letter at
    the row's start, after '. ', or after a whole query '?kV ')."""
    out = {}
    for i, b in enumerate(row):
        if b != Q or i + 2 >= len(row):
            continue
        k = row[i + 1] - ord("0")
        if task == "select_last":
            marks = [j + 1 for j in range(i) if row[j] == W]
        else:
            marks = [j for j in range(i) if _upper(row[j]) and (
                j == 0 or (row[j - 1] == SP and (row[j - 2] == DOT or (j >= 4 and row[j - 4] == Q))))]
        out[i + 2] = (k, marks[-k])
    return out


@pytest.mark.parametrize("task", counting.TASKS)
@pytest.mark.parametrize("stretch", [1, 3])
def test_every_answer_is_the_naive_parsers(task, stretch):
    b = counting.generate(task, 6, 200 * stretch, back=3, stretch=stretch, g=torch.Generator().manual_seed(stretch))
    for n in range(6):
        row = b["tokens"][n].tolist()
        naive = naive_answers(task, row)
        assert sorted(naive) == b["answers"][n].nonzero()[:, 0].tolist()
        assert len(naive) >= 5
        for at, (k, src) in naive.items():
            assert 1 <= k <= 3 and int(b["back"][n, at]) == k and int(b["sources"][n, at]) == src
            assert row[at] == row[src] and _upper(row[at])
        assert int(b["back"][n][~b["answers"][n]].abs().sum()) == 0
        assert bool((b["sources"][n][~b["answers"][n]] == -1).all())


@pytest.mark.parametrize("task", counting.TASKS)
def test_rows_are_a_pure_function_of_the_generator(task):
    a = counting.generate(task, 4, 128, g=make_generator(1, 2))
    b = counting.generate(task, 4, 128, g=make_generator(1, 2))
    c = counting.generate(task, 4, 128, g=make_generator(1, 3))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tokens"], c["tokens"])
    assert a["tokens"].shape == (4, 128) and a["tokens"].dtype == torch.long


@pytest.mark.parametrize("task", counting.TASKS)
def test_no_fixed_token_distance_finds_the_answer(task):
    """Segments of variable length: for every k, the most common distance from the answer to its
    source covers a small share of the answers (a model that reads a fixed offset fails), while the
    count back is exact."""
    b = counting.generate(task, 64, 256, back=3, g=torch.Generator().manual_seed(0))
    at = b["answers"].nonzero()
    dist = (at[:, 1] - b["sources"][at[:, 0], at[:, 1]]).tolist()
    ks = b["back"][at[:, 0], at[:, 1]].tolist()
    for k in (1, 2, 3):
        d = [x for x, kk in zip(dist, ks) if kk == k]
        assert len(d) > 50
        assert Counter(d).most_common(1)[0][1] / len(d) < 0.25, (k, Counter(d).most_common(3))


@pytest.mark.parametrize("task", counting.TASKS)
def test_stretch_lengthens_segments_not_the_count(task):
    """At stretch s the source is about s times as far in tokens; k keeps its range."""
    def mean_distance(s: int) -> float:
        b = counting.generate(task, 32, 256 * s, back=2, stretch=s, g=torch.Generator().manual_seed(5))
        at = b["answers"].nonzero()
        assert set(b["back"][b["answers"]].tolist()) == {1, 2}
        return float((at[:, 1] - b["sources"][at[:, 0], at[:, 1]]).double().mean())

    one, four = mean_distance(1), mean_distance(4)
    assert 2.5 < four / one < 4.5


def test_back_one_is_the_last_occurrence():
    b = counting.generate("select_last", 8, 256, back=1, g=torch.Generator().manual_seed(3))
    for n in range(8):
        row = b["tokens"][n].tolist()
        for at in b["answers"][n].nonzero()[:, 0].tolist():
            last = max(j for j in range(at) if row[j] == W)
            assert row[at] == row[last + 1] and row[at - 1] == ord("1")


@pytest.mark.parametrize("kwargs,needle", [
    ({"task": "select_lst"}, "did you mean 'select_last'"),
    ({"back": 0}, "back = 0"),
    ({"back": 10}, "back = 10"),
    ({"stretch": 0}, "stretch 0"),
    ({"length": 40, "stretch": 4}, "too short"),
    ({"length": 8}, "too short"),
])
def test_bad_sizes_are_one_paragraph_data_errors(kwargs, needle):
    args = {"task": "select_last", "length": 128, "back": 3, "stretch": 1, **kwargs}
    with pytest.raises(DataError) as e:
        counting.generate(args.pop("task"), 2, args.pop("length"), g=torch.Generator(), **args)
    d = e.value.diagnostics[0]
    msg = f"{d.message} {d.hint}"
    assert needle in msg and "\n" not in e.value.diagnostics[0].message and e.value.diagnostics[0].hint


def test_the_stream_marks_the_answers_and_mixes_the_tasks():
    cfg = DataConfig(source="select_last:0.5,sentence_first:0.5", count_back=2)
    assert parse_mixture(cfg.source) == [("select_last", 0.5), ("sentence_first", 0.5)]
    data = TrainData(cfg, 128, seed=7)
    rows, mask = data.train_rows(3, 16)
    again, mask2 = TrainData(cfg, 128, seed=7).train_rows(3, 16)
    assert torch.equal(rows, again) and torch.equal(mask, mask2) and rows.shape == (16, 129)
    assert set(data.sources(0, 3, 16)) == {"select_last", "sentence_first"}
    for r, m in zip(rows.tolist(), mask):
        task = "select_last" if W in r else "sentence_first"
        naive = naive_answers(task, r)
        assert sorted(naive) == m.nonzero()[:, 0].tolist()
        assert all(k <= 2 for k, _ in naive.values())


def test_a_window_too_short_is_refused_before_training(tmp_path):
    with pytest.raises(DataError, match="too short"):
        TrainData(DataConfig(source="sentence_first"), 8, seed=0)
    code, _, err = run_cli("train", "rope", "--out", tmp_path / "r", "--data", "select_last", "--context", "8",
                           "--steps", "1", "-q", "--threads", "1")
    assert code == 1 and "too short" in err and "Traceback" not in err
    code, _, err = run_cli("train", "rope", "--out", tmp_path / "r2", "--data", "select_last", "--set",
                           "count_back=12", "--steps", "1", "-q", "--threads", "1")
    assert code in (1, 2) and "count_back" in err and "Traceback" not in err
