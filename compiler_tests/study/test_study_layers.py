"""`pedsl compare --study layers`: its schemes (full, windowed, Gemma-3 5:1 and Llama-4 NoPE-interleaved
layer maps, with and without learned sinks, and a sink token) load as described, its default seeds and
measures (perplexity to 32x, retrieval to 16x), one unit per scheme and seed for --jobs, and the
study end to end at a toy budget: runs per seed, the learned sink's share, the layer maps in the
report, reuse on a rerun."""

from __future__ import annotations

import json

import pytest
import yaml

from compiler_helpers import run_cli as _cli
from pedsl.study import parallel
from pedsl.study.layers import recipe as lr
from pedsl.study.seeded.run import describe, study_settings
from pedsl.train.recipe import load_scheme

TOY = ["--quick", "--steps", "3", "--windows", "1", "--threads", "1", "--set", "context=72",
       "--set", "batch_size=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "head_dim=16",
       "--set", "data.max_bytes=100000", "--set", "eval_every=3", "--set", "eval_batches=1", "--set", "warmup=1", "--set", "multikey_keys=1"]


def _layers(item: str, n: int = 6) -> list[tuple[str, object]]:
    s = load_scheme(item, params={"layers": n} if item.endswith(("gemma3.pe", "gemma3_sink.pe", "llama4.pe",
                                                                   "llama4_sink.pe")) else None)
    if s.layers is None:
        return [(s.name, s)] * n
    return [(name, s.layers.parts[name]) for name in s.layers.assign(n)]


def test_the_schemes_are_what_the_study_says():
    from pedsl.lang.library import scheme_file

    by = {name: _layers(str(scheme_file(item))) for name, item in
          (("rope", "rope"), ("rope_sink", "rope_sink"), ("rope_sink_token", "rope_sink_token"), *lr.OWN.items())}
    assert set(by) == {"rope", "rope_swa", "gemma3", "llama4", "rope_sink", "rope_swa_sink", "gemma3_sink",
                       "llama4_sink", "rope_sink_token"} and len(lr.SCHEMES) == 10 and lr.SCHEMES[-1] == "rope_id"
    for name, layers in by.items():
        sinks = {p.sink for _, p in layers}
        assert sinks == ({"logit"} if name.endswith("_sink") else {"token"} if name.endswith("token") else {None}), name
        shape = [(p.window, p.chunk, bool(p.transports), p.temperature is not None) for _, p in layers]
        base = name.removesuffix("_sink").removesuffix("_sink_token")
        want = {"rope": [(None, None, True, False)] * 6, "rope_swa": [(32, None, True, False)] * 6,
                "gemma3": [(32, None, True, False)] * 5 + [(None, None, True, False)],
                "llama4": [(None, 32, True, False)] * 3 + [(None, None, False, True)] + [(None, 32, True, False)] * 2}
        assert shape == want[base], name
    g = dict(_layers(lr.OWN["gemma3"]))
    assert g["gemma3_local"].params["base"] == 10000.0 and g["gemma3_global"].params["base"] == 1000000.0
    assert "layers 0-4 gemma3_local, 5 gemma3_global" in describe(lr.OWN["gemma3"], 6)


def test_default_seeds_measures_and_units(tmp_path):
    st = study_settings("layers", quick=False, windows=None, analyze_max=None)
    m = st["measures"]
    assert st["seeds"] == (0, 1, 2) and st["train"]["n_layers"] == 6 and st["data"] == lr.MIXTURE
    assert m.eval_lengths(128) == [128 * k for k in (1, 2, 4, 8, 16, 32)]
    assert m.retrieval_lengths(128) == [128 * k for k in (1, 2, 4, 8, 16)]
    assert m.analysis_lengths(128) == [128, 256, 512, 1024]
    units = parallel.seeded_units("layers", [], tmp_path / "s", seeds=None, quick=False, windows=None,
                                  analyze_max=None, lengths=None)
    assert len(units) == 30 and {u.label for u in units} >= {"gemma3 seed 2", "rope_sink_token seed 0"}
    named = parallel.seeded_units("layers", ["gemma3", "rope"], tmp_path / "s", seeds=[4], quick=True,
                                  windows=None, analyze_max=None, lengths=None)
    assert [u.label for u in named] == ["gemma3 seed 4", "rope seed 4"]


@pytest.mark.slow
def test_layers_study_end_to_end(tmp_path):
    out = tmp_path / "study"
    args = ["compare", "--study", "layers", "rope", "gemma3_sink", "--seeds", "0,1", "--out", str(out), *TOY]
    code, stdout, err = _cli(*args)
    assert code == 0, err
    for name in ("report.md", "results.json", "ppl_ratio.png", "far_mass.png", "sink_mass.png", "niah_all.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for seed in (0, 1):
        run = out / "runs" / "gemma3_sink" / f"seed{seed}"
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert cfg["seed"] == seed and cfg["model"]["n_layers"] == 6 and cfg["data"]["source"] == lr.MIXTURE
        state = json.loads(next((run / "checkpoints").glob("step_*/state.json")).read_text())
        assert state["scheme_layers"] == ["gemma3_local_sink"] * 5 + ["gemma3_global_sink"]
        assert sorted(json.loads((run / "eval.json").read_text())["ppl"], key=int) == ["72", "144", "288"]
        assert set(json.loads((run / "retrieval.json").read_text())["overall"]) <= {"72", "144"}  # 2x, quick
        an = json.loads((run / "analysis.json").read_text())["summary"]
        assert all(v > 0 for v in an["learned_sink_mass"].values())
    an = json.loads((out / "runs" / "rope" / "seed0" / "analysis.json").read_text())["summary"]
    assert all(v == 0 for v in an["learned_sink_mass"].values())
    md = (out / "report.md").read_text()
    assert "learned sink @ 72" in md and "layers 0-4 gemma3_local_sink, 5 gemma3_global_sink" in md
    assert "Retrieval digit accuracy vs length" in md and "seeds [0, 1]" in md
    code, _, err = _cli(*args)
    assert code == 0, err
    assert err.count("reusing the finished run") == 4
