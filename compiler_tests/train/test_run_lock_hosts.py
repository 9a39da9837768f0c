"""The run lock across hosts sharing a filesystem: an atomically created lock file with host, pid and
a heartbeat; a live owner on another host keeps it, one whose heartbeat stopped loses it, of several
processes taking over an abandoned lock exactly one wins, and a release never removes a lock that
another process took over. A takeover claim left by a taker that died (gone on this host, or stale
from another host) is removed by the next taker; a live claim is not."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from pedsl.errors import OutputError
from pedsl.train import runlock


def _plant(run, owner: dict, age: float) -> None:
    path = run / runlock.LOCK_NAME
    path.write_text(json.dumps(owner))
    os.utime(path, (time.time() - age, time.time() - age))


OTHER = {"pid": 4242, "host": "node-that-is-not-this-one", "since": "2026-01-01 00:00:00", "nonce": "x"}


def test_a_live_owner_on_another_host_keeps_the_lock(tmp_path):
    _plant(tmp_path, OTHER, age=5)
    with pytest.raises(OutputError, match="in use by another pedsl process \\(pid 4242 on host node-that-is-not"):
        runlock.RunLock(tmp_path).acquire()
    assert json.loads((tmp_path / runlock.LOCK_NAME).read_text()) == OTHER  # untouched


def test_an_owner_whose_heartbeat_stopped_loses_the_lock(tmp_path):
    _plant(tmp_path, OTHER, age=runlock.STALE + 5)
    lock = runlock.RunLock(tmp_path).acquire()
    assert lock.stale == OTHER
    held = json.loads((tmp_path / runlock.LOCK_NAME).read_text())
    assert held["pid"] == os.getpid() and held["host"] != OTHER["host"]
    lock.release()
    assert not (tmp_path / runlock.LOCK_NAME).exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary or stale copies left


def test_the_heartbeat_keeps_a_held_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "HEARTBEAT", 0.05)
    with runlock.RunLock(tmp_path):
        path = tmp_path / runlock.LOCK_NAME
        os.utime(path, (time.time() - 1000, time.time() - 1000))
        time.sleep(0.5)
        assert time.time() - path.stat().st_mtime < 5


def test_of_several_takers_of_an_abandoned_lock_exactly_one_wins(tmp_path):
    _plant(tmp_path, OTHER, age=runlock.STALE + 5)
    go, won, refused = threading.Barrier(8), [], []

    def take():
        go.wait()
        try:
            won.append(runlock.RunLock(tmp_path).acquire())
        except OutputError:
            refused.append(1)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7
    assert json.loads((tmp_path / runlock.LOCK_NAME).read_text())["nonce"] == won[0].token["nonce"]
    won[0].release()


def test_a_release_never_removes_a_lock_another_process_took_over(tmp_path):
    lock = runlock.RunLock(tmp_path).acquire()
    (tmp_path / runlock.LOCK_NAME).write_text(json.dumps(OTHER))  # taken over while we were paused
    lock.release()
    assert json.loads((tmp_path / runlock.LOCK_NAME).read_text()) == OTHER


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _plant_claim(run, lock_owner: dict, taker: dict, age: float):
    claim = runlock._claim_path(run / runlock.LOCK_NAME, lock_owner)
    claim.write_text(json.dumps(taker))
    os.utime(claim, (time.time() - age, time.time() - age))
    return claim


def test_a_claim_left_by_a_taker_that_died_on_this_host_is_taken_over(tmp_path):
    import socket

    dead_owner = {"pid": _dead_pid(), "host": socket.gethostname(), "since": "2026-01-01 00:00:00", "nonce": "own"}
    _plant(tmp_path, dead_owner, age=1)  # a fresh heartbeat, but its process is gone
    taker = {"pid": _dead_pid(), "host": socket.gethostname(), "since": "2026-01-01 00:00:01", "nonce": "tk"}
    claim = _plant_claim(tmp_path, dead_owner, taker, age=1)  # a fresh claim, its process gone too
    lock = runlock.RunLock(tmp_path).acquire()
    assert lock.stale == dead_owner and not claim.exists()
    assert json.loads((tmp_path / runlock.LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert list(tmp_path.iterdir()) == []


def test_a_stale_claim_from_another_host_is_taken_over(tmp_path):
    _plant(tmp_path, OTHER, age=runlock.STALE + 5)
    taker = {"pid": 777, "host": "another-node", "since": "2026-01-01 00:00:01", "nonce": "tk"}
    claim = _plant_claim(tmp_path, OTHER, taker, age=runlock.CLAIM_STALE + 5)
    lock = runlock.RunLock(tmp_path).acquire()
    assert lock.stale == OTHER and not claim.exists()
    lock.release()


@pytest.mark.parametrize("where", ["this host", "another host"])
def test_a_live_claim_is_not_stolen(tmp_path, where):
    import socket
    import subprocess
    import sys

    _plant(tmp_path, OTHER, age=runlock.STALE + 5)  # an abandoned lock ...
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        taker = ({"pid": live.pid, "host": socket.gethostname()} if where == "this host"
                 else {"pid": 4243, "host": "another-node"})  # ... being taken over right now by a live process
        taker |= {"since": "2026-01-01 00:00:01", "nonce": "tk"}
        claim = _plant_claim(tmp_path, OTHER, taker, age=runlock.CLAIM_STALE + 5 if where == "this host" else 1)
        with pytest.raises(OutputError, match=f"being taken over by another pedsl process \\(pid {taker['pid']}"):
            runlock.RunLock(tmp_path).acquire()
        assert json.loads(claim.read_text()) == taker
        assert json.loads((tmp_path / runlock.LOCK_NAME).read_text()) == OTHER  # untouched
    finally:
        live.kill()
        live.wait()


def test_a_live_owner_on_this_host_with_an_old_heartbeat_keeps_the_lock_and_is_named(tmp_path):
    """A live process whose heartbeat is an hour old is hung or stopped: when it goes on it writes into the
    run again, so its lock is refused, with the heartbeat's age and what to do."""
    import socket
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.1)
        owner = {"pid": child.pid, "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "nonce": "n"}
        _plant(tmp_path, owner, age=3600)
        with pytest.raises(OutputError, match="alive but has not touched the lock for 60 minutes") as err:
            runlock.RunLock(tmp_path).acquire()
        assert f"end pid {child.pid}" in err.value.hint
        assert json.loads((tmp_path / runlock.LOCK_NAME).read_text()) == owner  # untouched
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="the pid's start time is read from /proc")
def test_a_pid_reused_by_a_process_started_after_the_lock_is_taken_over(tmp_path):
    """The lock names this test's own pid (alive) but says it was taken an hour before this process started:
    its owner died and the pid was given to another process, so the lock is abandoned."""
    import socket

    before = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_started() - 3600))
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": before, "nonce": "n"}
    _plant(tmp_path, owner, age=3600)
    lock = runlock.RunLock(tmp_path).acquire()
    assert lock.stale == owner
    lock.release()


def _started() -> float:
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")
