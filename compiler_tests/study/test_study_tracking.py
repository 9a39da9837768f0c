"""`pedsl compare --track tensorboard|mlflow`: a study's runs, metrics, evaluation, configuration and
report in the tracker, read back with each library's own reader (tensorboard's EventAccumulator,
mlflow's client): written live while a run trains (read back before it finished), completed from the
study's files at the end (runs trained before tracking, evaluations, report and plots); a missing
library is a one-line error naming the extra."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from compiler_helpers import F32_EPS
from compiler_helpers import run_cli as _cli
from pedsl.errors import ConfigError
from pedsl.study import tracking


def _study(tmp_path: Path) -> Path:
    """A finished two-run study as the study code writes it (files only: no training)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = tmp_path / "study"
    for name, shift in (("rope", 0.0), ("alibi/seed1", 0.5)):
        run = out / "runs" / name
        run.mkdir(parents=True)
        (run / "DONE.json").write_text(json.dumps({"steps": 20, "scheme": name.split("/")[0], "scheme_hash": "ab" * 32}))
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "loss": 5.0 - s / 10 + shift, "lr": 1e-3 * s, "grad_norm": 1.5,
                        "tokens_per_s": 1000.0 + s, **({"val_loss": 4.0 + shift} if s == 20 else {})}) + "\n"
            for s in (10, 20)))
        (run / "eval.json").write_text(json.dumps({"ppl": {"32": {"ppl": 50.0, "ratio": 1.0},
                                                           "64": {"ppl": 60.0, "ratio": 1.2 + shift}},
                                                   "passkey": {"64": {"accuracy": 0.25}}}))
        (run / "config.yaml").write_text("preset: tiny\nmodel:\n  d_model: 32\n  n_layers: 1\nseed: 0\n")
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [1, 0])
    fig.savefig(out / "ppl_ratio.png")
    plt.close(fig)
    (out / "report.md").write_text("# the report\n")
    (out / "results.json").write_text(json.dumps({"meta": {"git": "abc1234", "command": "pedsl compare"}}))
    return out


def test_tensorboard_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = _study(tmp_path)
    tracking.track_study("tensorboard", out)
    tracking.track_study("tensorboard", out)  # again: no doubled points (one file of steps, one of evaluation)
    files = sorted(p.name.rsplit(".", 1)[-1] for p in (out / "runs" / "rope" / "tensorboard").glob("events.out.tfevents.*"))
    assert files == ["eval", "train"]
    acc = EventAccumulator(str(out / "runs" / "alibi" / "seed1" / "tensorboard"))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [(e.step, round(e.value, 5)) for e in loss] == [(10, 4.5), (20, 3.5)]
    assert [e.value for e in acc.Scalars("train/val_loss")] == [4.5]
    assert [(e.step, round(e.value, 5)) for e in acc.Scalars("eval/ppl_ratio")] == [(32, 1.0), (64, 1.7)]
    assert [round(e.value, 5) for e in acc.Scalars("train/lr")] == [0.01, 0.02]
    assert acc.Scalars("eval/passkey_accuracy")[0].value == 0.25
    study = EventAccumulator(str(out / "tensorboard"))
    study.Reload()
    img = study.Images("report/ppl_ratio")[0]
    assert img.width == 200 and img.height == 150 and img.encoded_image_string[:4] == b"\x89PNG"


def test_mlflow_parent_and_child_runs_read_back(tmp_path):
    from mlflow.tracking import MlflowClient

    out = _study(tmp_path)
    parent = tracking.track_study("mlflow", out)  # the default store: in the study folder
    uri = f"sqlite:///{out.resolve() / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_run(parent).info.experiment_id
    children = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    by_name = {r.info.run_name: r for r in children}
    assert set(by_name) == {"rope", "alibi/seed1"}
    child = by_name["alibi/seed1"]
    assert child.data.params["scheme"] == "alibi" and child.data.params["scheme_hash"] == "ab" * 32
    assert child.data.params["commit"] == "abc1234" and child.data.params["config.model.d_model"] == "32"
    history = client.get_metric_history(child.info.run_id, "train/loss")
    assert sorted((m.step, round(m.value, 5)) for m in history) == [(10, 4.5), (20, 3.5)]
    ratio = client.get_metric_history(child.info.run_id, "eval/ppl_ratio")
    assert sorted((m.step, round(m.value, 5)) for m in ratio) == [(32, 1.0), (64, 1.7)]
    arts = {a.path for a in client.list_artifacts(parent)}
    assert {"report.md", "results.json", "ppl_ratio.png"} <= arts
    assert client.get_run(parent).data.params["commit"] == "abc1234"
    assert (out / "mlartifacts").is_dir()  # the artifacts stay with the study, not in the working folder


def test_a_missing_tracker_library_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    with pytest.raises(ConfigError, match=r"needs the optional package 'mlflow'") as err:
        tracking.require("mlflow")
    assert err.value.hint == "pip install 'pedsl[mlflow]'"
    code, _, err_text = _cli("compare", "rope", "--out", tmp_path / "s", "--track", "mlflow", "-q")
    assert code == 1 and "pip install 'pedsl[mlflow]'" in err_text and not (tmp_path / "s").exists()
    code, _, err_text = _cli("compare", "rope", "--out", tmp_path / "s", "--tracking-uri", "file:/x", "-q")
    assert code == 2 and "--tracking-uri applies to --track mlflow only" in err_text


def _train_live(run: Path, spec, steps: int = 24) -> tuple[threading.Thread, list]:
    """Train a small run in a thread of this process, reporting to ``spec``; slow steps (a sleeping
    attention) so that it is still training while the test reads the tracker."""
    from pedsl.train import live
    from pedsl.train.loop import train
    from train_helpers import helper, small_cfg

    cfg = small_cfg(steps=steps, log_every=1, eval_every=steps, checkpoint_every=steps)
    errors: list = []

    def work() -> None:
        live.use(spec)
        try:
            train(cfg, run, attention=helper.spec("nope", sleep=0.15), quiet=True)
        except Exception as exc:  # reported by the test
            errors.append(exc)
        finally:
            live.use(None)

    t = threading.Thread(target=work)
    t.start()
    return t, errors


def _wait_for(cond, t: threading.Thread, timeout: float = 120.0):
    end = time.time() + timeout
    while time.time() < end:
        got = cond()
        if got:
            return got
        assert t.is_alive(), "the run finished before the tracker was read"
        time.sleep(0.2)
    raise AssertionError("nothing was tracked while the run trained")


def test_tensorboard_is_written_live_while_the_run_trains(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pedsl.train import live

    run = tmp_path / "study" / "runs" / "nope"
    t, errors = _train_live(run, live.Spec("tensorboard"))

    def seen():
        if not (run / "tensorboard").is_dir():
            return None
        acc = EventAccumulator(str(run / "tensorboard"))
        acc.Reload()
        return acc.Scalars("train/loss") if "train/loss" in acc.Tags()["scalars"] and \
            len(acc.Scalars("train/loss")) >= 3 else None

    early = _wait_for(seen, t)
    assert not (run / "DONE.json").exists() and t.is_alive()  # read while it trains
    t.join()
    assert not errors, errors
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # the same number logged twice: TensorBoard stores a float32 scalar, one rounding of the logged float64
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [
        (r["step"], pytest.approx(r["loss"], rel=F32_EPS, abs=0)) for r in logged]
    assert [e.step for e in early] == [r["step"] for r in logged][:len(early)]
    assert {"train/lr", "train/tokens_per_s", "train/grad_norm", "train/val_loss"} <= set(acc.Tags()["scalars"])


def test_mlflow_child_run_is_written_live_and_the_study_completes_it(tmp_path):
    from mlflow.tracking import MlflowClient

    from pedsl.train import live

    out = tmp_path / "study"
    spec = tracking.start_study("mlflow", out)
    client = MlflowClient(tracking_uri=spec.uri)
    assert client.get_run(spec.parent).info.status == "RUNNING"
    run = out / "runs" / "nope"
    t, errors = _train_live(run, spec)

    def seen():
        child = live.find_child(client, spec, run)
        history = client.get_metric_history(child, "train/loss") if child else []
        return (child, history) if len(history) >= 3 else None

    child, early = _wait_for(seen, t)
    assert not (run / "DONE.json").exists() and t.is_alive()  # read while it trains
    assert client.get_run(child).info.status == "RUNNING"
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == spec.parent
    t.join()
    assert not errors, errors
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    history = sorted((m.step, m.value) for m in client.get_metric_history(child, "train/loss"))
    assert history == [(r["step"], r["loss"]) for r in logged]  # the same float64 logged twice: exact
    finished = client.get_run(child)
    assert finished.info.status == "FINISHED" and finished.data.params["scheme"] == "nope"
    import yaml

    context = yaml.safe_load((run / "config.yaml").read_text())["context"]
    assert finished.data.params["config.context"] == str(context) and finished.data.params["commit"] == str(spec.commit)
    # the study measures the run and ends: its evaluation and report are added, the live child is kept
    (run / "eval.json").write_text(json.dumps({"ppl": {"32": {"ppl": 50.0, "ratio": 1.0},
                                                       "64": {"ppl": 60.0, "ratio": 1.25}}}))
    (out / "report.md").write_text("# report\n")
    tracking.track_study("mlflow", out, spec=spec)
    tracking.track_study("mlflow", out, spec=spec)  # again: no second child, no doubled points
    children = client.search_runs([spec.experiment], filter_string=f"tags.mlflow.parentRunId = '{spec.parent}'")
    assert [c.info.run_id for c in children] == [child]
    ratio = sorted((m.step, m.value) for m in client.get_metric_history(child, "eval/ppl_ratio"))
    assert ratio == [(32, 1.0), (64, 1.25)]
    assert "report.md" in {a.path for a in client.list_artifacts(spec.parent)}
    assert client.get_run(spec.parent).info.status == "FINISHED"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bad_stores(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name: (uri, what the error says); the files they name are the user's and must stay as they are."""
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    (tmp_path / "link.db").symlink_to(text)
    (tmp_path / "dangling.db").symlink_to(tmp_path / "elsewhere" / "target.db")
    (tmp_path / "folder").mkdir()
    closed = _closed_port()
    return {
        "text-file": (f"sqlite:///{text}", "not an SQLite database"),
        "link-to-file": (f"sqlite:///{tmp_path / 'link.db'}", "is a symbolic link"),
        "dangling-link": (f"sqlite:///{tmp_path / 'dangling.db'}", "is a symbolic link"),
        "dev-null": ("sqlite:////dev/null", "is a system file"),
        "proc-mem": ("sqlite:////proc/self/mem", "is a system file"),
        "folder": (f"sqlite:///{tmp_path / 'folder'}", "is a folder"),
        "no-folder": (f"sqlite:///{tmp_path / 'missing' / 'x.db'}", "does not exist"),
        "empty": ("", "it is empty"),
        "sqlite-memory": ("sqlite://", "in memory"),
        "sqlite-memory-named": ("sqlite:///:memory:", "in memory"),
        "http-closed": (f"http://127.0.0.1:{closed}", f"nothing accepts a connection at 127.0.0.1:{closed} within 3 s"),
        "postgres-closed": (f"postgresql://u:p@127.0.0.1:{closed}/db", "nothing accepts a connection"),
        "bare-path": (str(tmp_path / "x.db"), "mlflow keeps no study record"),
    }


@pytest.mark.parametrize("name", [
    "text-file", "link-to-file", "dangling-link", "dev-null", "proc-mem", "folder", "no-folder", "empty",
    "sqlite-memory", "sqlite-memory-named", "http-closed", "postgres-closed", "bare-path"])
def test_an_unusable_tracking_store_is_refused_in_seconds_and_nothing_is_written(tmp_path, monkeypatch, name):
    """Each was exit 3 (a DatabaseError), a retry of 60 to 252 s, a write through a link, or exit 0 with the
    record lost; now E981 before the study starts, within the 3 s connection timeout."""
    pytest.importorskip("mlflow")
    user = tmp_path / "user"
    user.mkdir()
    uri, said = _bad_stores(user)[name]
    before = sorted((p.name, p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
                    for p in user.iterdir())
    monkeypatch.chdir(user)
    t0 = time.monotonic()
    code, _, err = _cli("compare", "rope", "--out", tmp_path / "s", "--track", "mlflow", "--tracking-uri", uri,
                        "--steps", "1", "-q")
    assert time.monotonic() - t0 < 10
    assert code == 1 and "error[E981]" in err and said in err, err
    assert not (tmp_path / "s").exists() and not (user / "elsewhere").exists() and not (user / "mlruns").exists()
    after = sorted((p.name, p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
                   for p in user.iterdir())
    assert after == before


def test_a_store_in_another_folder_keeps_the_artifacts_in_the_study_never_in_the_working_folder(tmp_path,
                                                                                                  monkeypatch):
    pytest.importorskip("mlflow")
    out = _study(tmp_path)
    (tmp_path / "store").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    tracking.track_study("mlflow", out, uri=f"sqlite:///{tmp_path / 'store' / 'other.db'}")
    assert list((tmp_path / "cwd").iterdir()) == []  # no ./mlruns
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["other.db"]
    assert any((out / "mlartifacts").rglob("report.md"))
