"""Data: the stdlib corpus is split deterministically and by file; local folders and files;
passkey and block tasks put the answers where they say; unusable data is a DataError."""

from __future__ import annotations

import pytest
import torch

from pedsl.config import DataConfig
from pedsl.data import TrainData, _generator, block_batch, load_corpus, passkey_batch, split_files, stdlib_files
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
    out = passkey_batch(8, 200, digits=5, g=_generator(1))
    toks, ans = out["tokens"], out["answer_positions"]
    assert toks.shape == (8, 200) and ans.shape == (8, 5)
    for row, pos in zip(toks, ans):
        text = bytes(row.tolist())
        key = bytes(row[pos].tolist())
        assert key.isdigit() and text.endswith(b"The pass key is " + key)
        assert text.index(b"The pass key is " + key + b". Remember it.") < len(text) - 60
    with pytest.raises(DataError, match="too short"):
        passkey_batch(1, 40, g=_generator(0))


def test_block_task_answers_copy_the_offset_token():
    out = block_batch(4, 100, block_len=8, offset=3, g=_generator(2))
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
