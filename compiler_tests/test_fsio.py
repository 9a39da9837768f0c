"""pedsl.fsio: atomic writes keep modes, refuse symlinks (unless editing the file the user named),
and fail with OutputError."""

from __future__ import annotations

import os

import pytest

from pedsl.errors import OutputError
from pedsl.fsio import atomic_write_text, ensure_dir


def test_new_file_gets_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]  # no temporary left behind


def test_existing_mode_is_kept_and_content_replaced(tmp_path):
    f = tmp_path / "b.txt"
    f.write_text("old")
    os.chmod(f, 0o600)
    atomic_write_text(f, "new")
    assert f.read_text() == "new" and f.stat().st_mode & 0o777 == 0o600


def test_symlink_is_refused_by_default(tmp_path):
    # Outputs (run folders, reports, compiled modules) never write through a link: a link planted
    # in an output folder (run/metrics.jsonl -> /elsewhere) would otherwise redirect the write.
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(target)
    with pytest.raises(OutputError, match="symbolic link") as exc:
        atomic_write_text(link, "new")
    assert "remove the link" in exc.value.hint
    assert link.is_symlink() and target.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.txt", "metrics.jsonl"]


def test_symlink_target_is_rewritten_when_editing_the_named_file(tmp_path):
    # `pedsl fmt --write link.pe` edits the source the user named: the file behind the link changes.
    target = tmp_path / "real.pe"
    target.write_text("old")
    link = tmp_path / "link.pe"
    link.symlink_to(target)
    atomic_write_text(link, "new", follow_symlinks=True)
    assert link.is_symlink() and target.read_text() == "new"


def test_missing_folder_and_file_in_the_way(tmp_path):
    with pytest.raises(OutputError, match="cannot write"):
        atomic_write_text(tmp_path / "nope" / "c.txt", "x")
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="a file of that name exists"):
        ensure_dir(tmp_path / "file")
