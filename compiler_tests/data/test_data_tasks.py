"""Data: the stdlib corpus is split deterministically and by file; local folders and files;
passkey and block tasks put the answers where they say; unusable data is a DataError."""

from __future__ import annotations

import pytest
import torch

from pedsl.config import DataConfig
from pedsl.data.corpus import load_corpus, split_files, stdlib_files
from pedsl.data.stream import TrainData, make_generator
from pedsl.data.synthetic import block_batch, passkey_batch
from pedsl.errors import DataError


def test_stdlib_split_is_deterministic_and_by_file():
    root, files = stdlib_files()
    assert files == sorted(files) and all(f.endswith(".py") for f in files)
    assert not any("site-packages" in f for f in files)
    tr, va = split_files(files, 0.1)
    assert split_files(files, 0.1) == (tr, va)
    assert set(tr).isdisjoint(va) and set(tr) | set(va) == set(files)
    assert 0.05 < len(va) / len(files) < 0.15
    # by file: a file's side does not depend on which other files exist
    tr2, va2 = split_files(files[::2], 0.1)
    assert set(va2) == set(va) & set(files[::2])


def test_stdlib_corpus_caps_bytes_and_has_a_unigram_baseline():
    c = load_corpus(DataConfig(max_bytes=100_000))
    assert c.train.dtype == torch.uint8 and c.train.numel() <= 90_000 + 1000 and c.val.numel() > 5_000
    assert torch.equal(load_corpus(DataConfig(max_bytes=100_000)).val, c.val)
    assert 2.5 < c.unigram_baseline() < 5.5  # nats/byte of source code


def test_local_folder_split_by_file(tmp_path):
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} " * 50)
    c = load_corpus(DataConfig(source=str(tmp_path), val_fraction=0.2))
    assert c.n_train_files + c.n_val_files == 40 and c.n_val_files > 0
    val_text = bytes(c.val.tolist()).decode()
    train_text = bytes(c.train.tolist()).decode()
    for i in range(40):  # each file is wholly on one side
        assert (f"file {i} " in val_text) != (f"file {i} " in train_text)


def test_single_file_is_split_by_bytes(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(bytes(range(256)) * 10)
    c = load_corpus(DataConfig(source=str(f), val_fraction=0.25))
    assert c.train.numel() == 1920 and c.val.numel() == 640


def test_empty_folder_missing_path_and_short_data(tmp_path):
    with pytest.raises(DataError, match="no files found"):
        load_corpus(DataConfig(source=str(tmp_path)))
    with pytest.raises(DataError, match="does not exist"):
        load_corpus(DataConfig(source=str(tmp_path / "missing")))
    (tmp_path / "a.txt").write_text("hello world " * 20)
    with pytest.raises(DataError, match="fewer than one window of context \\+ 1 = 513") as exc:
        TrainData(DataConfig(source=str(tmp_path)), context=512, seed=0)
    assert "--context" in exc.value.hint


def test_passkey_answers_are_the_key():
    out = passkey_batch(8, 200, digits=5, g=make_generator(1))
    toks, ans = out["tokens"], out["answer_positions"]
    assert toks.shape == (8, 200) and ans.shape == (8, 5)
    for row, pos in zip(toks, ans):
        text = bytes(row.tolist())
        key = bytes(row[pos].tolist())
        assert key.isdigit() and text.endswith(b"The pass key is " + key)
        assert text.index(b"The pass key is " + key + b". Remember it.") < len(text) - 60
    with pytest.raises(DataError, match="too short"):
        passkey_batch(1, 40, g=make_generator(0))


def test_block_task_answers_copy_the_offset_token():
    out = block_batch(4, 100, block_len=8, offset=3, g=make_generator(2))
    toks, ans = out["tokens"], out["answer_positions"]
    assert ans[0].tolist() == [15, 23, 31, 39, 47, 55, 63, 71, 79, 87, 95]
    for row, pos in zip(toks, ans):
        assert torch.equal(row[pos], row[pos - 7 + 3])
    assert bool((toks >= ord("a")).all() and (toks <= ord("z")).all())


def test_train_batches_are_a_function_of_the_step_and_shard_by_rank():
    d = TrainData(DataConfig(max_bytes=50_000), context=16, seed=0)
    a = d.train_batch(3, 8)
    assert torch.equal(a, d.train_batch(3, 8)) and not torch.equal(a, d.train_batch(4, 8))
    assert torch.equal(torch.cat([d.train_batch(3, 8, 0, 2), d.train_batch(3, 8, 1, 2)]),
                       torch.cat([a[0::2], a[1::2]]))
    assert torch.equal(d.val_batch(0, 4), d.val_batch(0, 4))
    for src in ("passkey", "blocks"):
        g = TrainData(DataConfig(source=src), context=128, seed=0)
        assert g.train_batch(0, 4).shape == (4, 129) and g.unigram_baseline() is None


# ---------------------------------------------------------------------------------------------
# Mixtures (--data stdlib:0.7,passkey:0.1,multikey:0.1,kv:0.1)

from pedsl.data.stream import parse_mixture, text_source  # noqa: E402

MIX = "stdlib:0.7,passkey:0.1,multikey:0.1,kv:0.1"


def _kind(row: torch.Tensor) -> str:
    t = bytes(row.tolist())
    if b"What is the pass key?" in t:
        return "passkey"
    if b"| " in t[-20:]:
        return "kv"
    if t.rfind(b" The key of ") > len(t) - 30:
        return "multikey"
    return "stdlib"


def test_mixture_spec_parses_normalises_and_rejects_bad_specs(tmp_path):
    assert parse_mixture("stdlib") is None and parse_mixture("kv") is None
    assert parse_mixture("stdlib:3,kv:1") == [("stdlib", 0.75), ("kv", 0.25)]
    assert text_source(DataConfig(source="passkey:1,kv:1")) is None
    assert text_source(DataConfig(source=f"{tmp_path}:0.5,kv:0.5")) == str(tmp_path)
    for bad, msg in (("stdlib:0.5,kv", "NAME:WEIGHT"), ("stdlib:x", "NAME:WEIGHT"), ("stdlib:0,kv:1", "positive"),
                     ("kv:1,kv:2", "twice"), (f"stdlib:1,{tmp_path}:1", "2 text sources")):
        with pytest.raises(DataError, match=msg):
            parse_mixture(bad)


def test_mixture_draws_sources_in_proportion_deterministically_per_seed_and_step():
    cfg = DataConfig(source=MIX, max_bytes=50_000)
    d = TrainData(cfg, context=128, seed=0)
    assert "mixture of 70% Python stdlib" in d.describe()
    counts = {"stdlib": 0, "passkey": 0, "multikey": 0, "kv": 0}
    for step in range(150):  # 2400 rows: the standard error of a 0.1 share is 0.006
        for name in d.sources(0, step, 16):
            counts[name] += 1
    total = sum(counts.values())
    assert abs(counts["stdlib"] / total - 0.7) < 0.04
    assert all(abs(counts[k] / total - 0.1) < 0.03 for k in ("passkey", "multikey", "kv"))
    # the rows are what the source says, the same for the same (seed, step), other for other steps/seeds
    b = d.train_batch(5, 16)
    assert b.shape == (16, 129) and [_kind(r) for r in b] == d.sources(0, 5, 16)
    again = TrainData(cfg, context=128, seed=0)
    assert torch.equal(again.train_batch(5, 16), b)
    assert not torch.equal(d.train_batch(6, 16), b)
    assert not torch.equal(TrainData(cfg, context=128, seed=1).train_batch(5, 16), b)
    assert torch.equal(torch.cat([d.train_batch(5, 16, 0, 2), d.train_batch(5, 16, 1, 2)]), torch.cat([b[0::2], b[1::2]]))
    assert not torch.equal(d.val_batch(0, 16), b)


def test_mixture_resumes_exactly(tmp_path):
    from train_helpers import helper, read_metrics, small_cfg

    from pedsl.train.loop import train

    cfg = small_cfg(steps=12, checkpoint_every=6, eval_every=6, log_every=3, context=80,
                    data="stdlib:0.5,passkey:0.25,kv:0.25", answer_weight=2.0, train_digits=[2, 7])
    assert cfg.data.answer_weight == 2.0 and cfg.data.train_digits == (2, 7)  # the weighted loss resumes too
    train(cfg, tmp_path / "ref", attention=helper.spec(), quiet=True)
    half = cfg.model_copy(update={"steps": 6})
    train(half, tmp_path / "cut", attention=helper.spec(), quiet=True)
    train(cfg, tmp_path / "cut", attention=helper.spec(), resume=True, quiet=True)
    key = lambda r: (r["step"], r["loss"], r.get("val_loss"))  # noqa: E731
    assert [key(r) for r in read_metrics(tmp_path / "cut")] == [key(r) for r in read_metrics(tmp_path / "ref")]


def test_task_context_too_short_is_a_data_error():
    with pytest.raises(DataError, match="too short for the 'multikey' task"):
        TrainData(DataConfig(source="stdlib:0.5,multikey:0.5", max_bytes=50_000), context=64, seed=0)


def test_runs_without_text_are_evaluated_on_their_generated_source():
    from pedsl.data.stream import make_generator, task_windows

    kv = task_windows(DataConfig(source="kv:1,passkey:1"), 3, 150, make_generator(0))
    assert kv.shape == (3, 150) and all(b"| " in bytes(r.tolist())[-20:] for r in kv)
    legacy = task_windows(DataConfig(source="passkey"), 2, 150, make_generator(0))
    assert all(b"Remember it." in bytes(r.tolist()) for r in legacy)
    blocks = task_windows(DataConfig(source="blocks"), 2, 64, make_generator(0))
    assert bool((blocks >= ord("a")).all())


def test_copy_rows_repeat_a_random_period_that_varies_by_row():
    from pedsl.data.synthetic import COPY_ALPHABET, copy_batch

    t = copy_batch(200, 129, g=make_generator(4))
    assert t.shape == (200, 129) and t.dtype == torch.long
    assert bool(torch.isin(t, COPY_ALPHABET).all())
    periods = []
    for row in t.tolist():  # the smallest s with row[i] == row[i - s] everywhere (naive search)
        s = next(s for s in range(1, 130) if all(row[i] == row[i - s] for i in range(s, 129)))
        periods.append(s)
    assert 3 <= min(periods) and max(periods) <= 16 and len(set(periods)) == 14
    wide = copy_batch(50, 129, min_period=10, max_period=64, g=make_generator(5))
    assert all(any(r[i] != r[i - 9] for i in range(9, 129)) for r in wide.tolist())  # no period below 10
    assert torch.equal(t, copy_batch(200, 129, g=make_generator(4)))
    # as a data source: alone, in a mixture with a task, and for the no-text evaluation windows
    from pedsl.data.stream import task_windows

    alone = TrainData(DataConfig(source="copy"), 64, 0).train_batch(3, 4)
    assert alone.shape == (4, 65) and bool(torch.isin(alone, COPY_ALPHABET).all())
    mixed = TrainData(DataConfig(source="copy:0.5,kv:0.5"), 64, 0)
    rows, src = mixed.train_batch(5, 32), mixed.sources(0, 5, 32)
    for r, s in zip(rows.tolist(), src):
        assert (s == "copy") == all(33 <= b < 127 for b in r)  # kv rows hold spaces and '; '
    assert mixed.corpus is None and text_source(DataConfig(source="copy:0.5,kv:0.5")) is None
    assert task_windows(DataConfig(source="copy"), 2, 40, make_generator(1)).shape == (2, 40)


@pytest.mark.parametrize("source", ["passkey", "multikey", "kv"])
def test_answer_mask_marks_exactly_the_asked_answer(source):
    from pedsl.data.stream import generated_rows

    cfg = DataConfig(source=f"{source}:1,copy:1")
    rows, mask = generated_rows(cfg, source, 6, 129, make_generator(7), mixed=True)
    assert rows.shape == mask.shape == (6, 129) and mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [5] * 6 and bool(mask[:, -5:].all())  # the last 5 bytes, nothing else
    for row in rows.tolist():
        text = bytes(row)
        answer, ask = text[-5:], text[:-5]
        assert answer.isdigit() and ask.count(answer) == 1  # the key is in the haystack once
        name = ask.rsplit(b"| ", 1)[-1] if source == "kv" else ask.rsplit(b"The key of ", 1)[-1]
        if source == "passkey":
            assert ask.endswith(b"The pass key is ") and (b"The pass key is " + answer + b". ") in ask
        else:  # multikey: "abc is "; kv: "abcd="
            assert (name + answer) in ask[: -len(name)]
    for plain in ("copy", "blocks"):
        _, none = generated_rows(cfg, plain, 3, 129, make_generator(8), mixed=True)
        assert not bool(none.any())


def test_train_rows_carry_the_mask_of_each_rows_source_and_match_train_batch():
    d = TrainData(DataConfig(source="stdlib:0.4,passkey:0.2,multikey:0.2,kv:0.2", max_bytes=50_000),
                  context=128, seed=3)
    rows, mask = d.train_rows(4, 32)
    assert torch.equal(rows, d.train_batch(4, 32)) and mask.shape == rows.shape
    src = d.sources(0, 4, 32)
    assert {"stdlib", "passkey"} <= set(src)
    for r, m, s in zip(rows, mask, src):
        if s == "stdlib":
            assert not bool(m.any())
        else:  # the marked bytes are the answer: the digits the row ends with
            assert m.nonzero().flatten().tolist() == list(range(124, 129)) and bytes(r[m].tolist()).isdigit()
    r1, m1 = d.train_rows(4, 32, 1, 2)
    assert torch.equal(r1, rows[1::2]) and torch.equal(m1, mask[1::2])


def test_train_digits_vary_the_answer_length_per_batch_and_task():
    cfg = DataConfig(source="passkey:0.5,kv:0.5", train_digits=(2, 9))
    d = TrainData(cfg, context=128, seed=0)
    seen = set()
    for step in range(40):
        rows, mask = d.train_rows(step, 8)
        for r, m, s in zip(rows, mask, d.sources(0, step, 8)):
            k = int(m.sum())
            assert 2 <= k <= 9 and m[-k:].all() and bytes(r[-k:].tolist()).isdigit()
            text = bytes(r.tolist())
            assert not text[-k - 1:-k].isdigit()  # exactly k digits end the row
            seen.add((s, k))
        assert torch.equal(d.train_rows(step, 8)[1], mask)  # a function of the step
    assert {k for _, k in seen} == set(range(2, 10))
    fixed = TrainData(DataConfig(source="passkey:0.5,kv:0.5"), context=128, seed=0).train_rows(3, 8)[1]
    assert fixed.sum(1).tolist() == [5] * 8
    with pytest.raises(ValueError, match="lo <= hi"):
        DataConfig(train_digits=(5, 2))
    # multikey with 3 keys fits at most 6 digits in 129 bytes: the range is cut there, not refused
    tight = TrainData(DataConfig(source="multikey", train_digits=(2, 10)), context=128, seed=0)
    counts = {int(tight.train_rows(step, 2)[1][0].sum()) for step in range(60)}
    assert counts == set(range(2, 7))
