"""`pedsl compare --track tensorboard|mlflow`: a study's runs, metrics, evaluation, configuration and
report exported to the tracker, read back with each library's own reader (tensorboard's
EventAccumulator, mlflow's client); a missing library is a one-line error naming the extra."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    tracking.track_study("tensorboard", out)  # again: replaces its event files, no doubled points
    assert len(list((out / "runs" / "rope" / "tensorboard").glob("events.out.tfevents.*"))) == 1
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
