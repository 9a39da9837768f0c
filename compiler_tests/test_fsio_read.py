"""Reading user paths: regular files only (a FIFO or device blocks or never ends), data streamed
up to max_bytes, symlinks out of a data folder refused."""

from __future__ import annotations

import os
import stat
import pytest

from compiler_helpers import run_capped, run_cli
from pedsl import fsio
from pedsl.config import DataConfig
from pedsl.errors import DataError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")


def test_open_regular_refuses_fifos_devices_and_folders(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(fsio.NotRegularFile, match="FIFO"):
        fsio.read_bytes(fifo)  # without a writer: must not block
    with pytest.raises(fsio.NotRegularFile, match="device"):
        fsio.read_bytes("/dev/zero")
    with pytest.raises(IsADirectoryError):
        fsio.read_bytes(tmp_path)
    f = tmp_path / "a.txt"
    f.write_bytes(b"hello world")
    assert fsio.read_bytes(f, 5) == b"hello" and fsio.read_text(f) == "hello world"


@pytest.mark.parametrize("cmd", ["check", "list"])
def test_check_and_list_refuse_a_fifo(tmp_path, cmd):
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / "s.pe")
    target = d if cmd == "list" else d / "s.pe"
    code, out = run_capped(["-m", "pedsl", cmd, str(target)], timeout=30)  # a subprocess: it used to hang
    assert code == 1, out
    assert "regular file" in out and "Traceback" not in out


@pytest.mark.parametrize("cmd", ["fmt", "show", "explain"])
def test_other_frontend_commands_refuse_a_fifo(tmp_path, cmd):
    fifo = tmp_path / "s.pe"
    os.mkfifo(fifo)
    code, out, err = run_cli(cmd, fifo)
    assert code in (1, 2) and "regular file" in out + err


def test_train_yaml_fifo_is_a_config_error(tmp_path):
    from pedsl.config import TrainConfig
    from pedsl.errors import ConfigError

    fifo = tmp_path / "train.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="regular file"):
        TrainConfig.from_yaml(fifo)
    with pytest.raises(ConfigError, match="regular file"):
        TrainConfig.from_yaml("/dev/zero")


def test_checkpoint_state_fifo_is_refused(tmp_path):
    from pedsl.train import checkpoint as ck

    ckpt = tmp_path / "step_1"
    ckpt.mkdir()
    os.mkfifo(ckpt / "state.json")
    from pedsl.errors import CheckpointError

    with pytest.raises(CheckpointError, match="state.json' cannot be read: not a regular file"):  # was: blocked forever
        ck.read_checkpoint(ckpt)


def test_data_folder_skips_fifos_and_refuses_links_out(tmp_path):
    from pedsl.data.corpus import load_corpus

    d = tmp_path / "data"
    d.mkdir()
    for i in range(4):
        (d / f"{i}.txt").write_text("some text to learn from\n" * 200)
    os.mkfifo(d / "pipe.txt")
    corpus = load_corpus(DataConfig(source=str(d), max_bytes=4096, val_fraction=0.25))
    assert corpus.train.numel() + corpus.val.numel() > 0
    os.symlink("/dev/zero", d / "zero.txt")
    with pytest.raises(DataError, match="leaves the data folder"):
        load_corpus(DataConfig(source=str(d), max_bytes=4096))
    (d / "zero.txt").unlink()
    secret = tmp_path / "secret.txt"
    secret.write_text("not data")
    os.symlink(secret, d / "s.txt")
    with pytest.raises(DataError, match="leaves the data folder"):
        load_corpus(DataConfig(source=str(d), max_bytes=4096))
    (d / "s.txt").unlink()
    (d / "sub").mkdir()
    os.symlink(d / "0.txt", d / "sub" / "inside.txt")  # a link that stays inside is fine
    load_corpus(DataConfig(source=str(d), max_bytes=4096))


def test_data_fifo_path_is_a_data_error(tmp_path):
    from pedsl.data.corpus import load_corpus

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="neither a regular file nor a folder"):
        load_corpus(DataConfig(source=str(fifo)))


@pytest.mark.slow
def test_a_huge_data_file_is_streamed_up_to_max_bytes(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as fh:  # 6 GB, sparse: no disk used
        fh.truncate(6 << 30)
    code, out = run_capped(["-c", "import sys; from pedsl.data.corpus import load_corpus; from pedsl.config import DataConfig;"
                            f"c = load_corpus(DataConfig(source={str(big)!r}, max_bytes=100000));"
                            "print(c.train.numel() + c.val.numel())"], timeout=60, mem_gb=2.0)
    assert code == 0, out
    assert out.split()[-1] == "100000"


def test_outputs_never_replace_a_device_or_fifo(tmp_path):
    from pedsl.errors import OutputError

    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not a regular file"):
        fsio.atomic_write_text(fifo, "{}")  # as root this replaced the node (analyze --out /dev/full did)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(OutputError, match="not a regular file"):
        fsio.atomic_write_text(tmp_path, "{}")
