"""Smoke test of the benchmark runner (`python -m benchmarks`): tiny sizes, structure of the JSON, agreement."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner

from compiler_helpers import float32_bound

from benchmarks.cases import make_inputs
from benchmarks.cli import bench


def test_bench_tiny_run_writes_json_and_markdown(tmp_path):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    threads = torch.get_num_threads()
    try:
        res = CliRunner().invoke(bench, ["rope", "alibi", "acc_random_qkv", "--lengths", "16", "--scaling-lengths",
                                         "16", "--repeats", "1", "-B", "1", "-H", "2", "-D", "8", "--no-memory",
                                         "--threads", "1", "--json", str(out), "--md", str(md), "-q"])
    finally:  # the runner sets process-wide state: put it back for the other tests
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    case = data["cases"]["16"]
    assert set(case) == {"rope", "alibi", "acc_random_qkv"}
    assert set(case["rope"]["variants"]) == {"floor", "hf", "pedsl"}
    assert set(case["alibi"]["variants"]) == {"floor", "materialised", "pedsl"}
    assert case["rope"]["variants"]["floor"]["fwdbwd_ratio"] == 1.0
    assert data["meta"]["clock"] == "cpu"
    # agreement is at L = 64, B = 2, H = 2, D = 8 in float32: two computations each within the longest chain (PaTH's
    # L reflections of D + 2 roundings, the softmax's and weighted sum's 2L, the score's D) of float64, at the
    # magnitude of the values (outputs are their convex combinations); a variant computing another function errs ~1
    L, D = 64, 8
    v = make_inputs(2, 2, L, D, 16)[2]
    bound = 2 * float32_bound(L * (D + 2) + 2 * L + D + 2, v)
    assert all(err <= bound for a in data["agreement"].values() for err in a.values())
    assert "| L | floor | rope | alibi | path |" in md.read_text()


def test_bench_unknown_scheme_is_a_usage_error():
    res = CliRunner().invoke(bench, ["no_such_scheme"])
    assert res.exit_code == 2
    assert "no scheme 'no_such_scheme'" in res.output


def test_decode_benchmark_tiny_run_times_the_general_path_too(tmp_path):
    """`python -m benchmarks.decode --general`: a tiny cache, one repeat; every variant has a row, the
    RoPE scheme also as NAME/general (fast path off), and the Markdown table has the spread column."""
    from benchmarks import decode

    threads = torch.get_num_threads()
    md = tmp_path / "d.md"
    try:
        decode.main(["rope", "alibi", "--cache", "24", "--repeats", "1", "--batch", "1", "--general",
                     "--md", str(md)])
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    text = md.read_text()
    for name in ("floor", "rope", "alibi", "rope/general"):
        assert f"| 24 | {name} |" in text
    assert "alibi/general" not in text and "min-max over repeats" in text


def test_distance_bias_benchmark_tiny_run_has_every_variant_and_ratio(tmp_path):
    """`python -m benchmarks.distance_bias`: one repeat at L = 48; T5 against x-transformers' materialised
    bias (checked equal first), xPos without one; ratios, peak memory and the load average recorded."""
    from benchmarks import distance_bias

    threads = torch.get_num_threads()
    md, js = tmp_path / "d.md", tmp_path / "d.json"
    try:
        distance_bias.main(["t5_bias", "xpos", "--lengths", "48", "--repeats", "1", "--threads", "1",
                            "--md", str(md), "--json", str(js)])
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    text = md.read_text()
    assert "| t5_bias | 48 |" in text and "| xpos | 48 |" in text and "skipped (no bias)" in text
    data = json.loads(js.read_text())
    assert data["meta"]["clock"] == "cpu" and len(data["meta"]["loadavg_start"]) == 3
    t5 = data["rows"][0]
    assert set(t5["ratio"]) == {"floor", "pedsl", "materialised"} and t5["ratio"]["floor"] == 1.0
    assert all(v >= 0 for v in t5["peak_mib"].values())


def test_cope_benchmark_tiny_run_compares_with_x_transformers(tmp_path):
    from benchmarks import cope

    md = tmp_path / "cope.md"
    threads = torch.get_num_threads()
    try:
        cope.main(["--lengths", "32", "--repeats", "1", "--threads", "1", "--max-pos", "4", "--md", str(md)])
    finally:  # the benchmark sets process-wide state: put it back for the other tests
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    rows = md.read_text().splitlines()
    assert [r.split("|")[2].strip() for r in rows[2:]] == ["floor", "pedsl", "x-transformers",
                                                           "pedsl / x-transformers"]
    assert rows[2].split("|")[4].strip() == "1.00"
