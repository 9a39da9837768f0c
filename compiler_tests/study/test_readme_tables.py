"""The README's main-job table is what the main job prints: generated from its results.json by
``readme_tables.main_job_table``, and checked here against a fresh run of the main job's settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compiler_helpers import ROOT
from tools.readme_tables import (BEGIN, MAIN_JOB, README, SPREAD, main_job_rows, main_job_table, readme_block,
                                 within_spread)
from pedsl.study.compare.run import DEFAULT_SCHEMES


def _readme_rows() -> dict[str, str]:
    return {line.split("|")[1].strip(): line for line in readme_block(README.read_text())[2:]}


def test_the_readme_table_is_the_generated_block_of_the_default_study():
    """The markers are there, with the default study's schemes in its order and the quickstart's command."""
    text = README.read_text()
    block = readme_block(text)
    assert block[0] == "| scheme | ppl @ 128 | 2x | 4x | **8x** | **16x** | 32x | far mass @ 1024 |"
    assert list(_readme_rows()) == list(DEFAULT_SCHEMES)
    assert MAIN_JOB in text and "pedsl compare --out compare" in text
    assert text.count(BEGIN) == 1


def test_the_table_generator_formats_results_json():
    """main_job_table on a hand-made results.json (the format pedsl compare writes)."""
    lens = [128, 256, 512, 1024, 2048, 4096]

    def run(ppl0: float, ratios: list[float], far: float) -> dict:
        ppl = {str(L): {"ppl": ppl0 * r, "ratio": r} for L, r in zip(lens, [1.0] + ratios)}
        return {"eval": {"ppl": ppl}, "analysis": {"summary": {"far_mass": {"512": 0.1, "1024": far}}}}

    doc = {"meta": {"context": 128}, "results": {"rope": run(4.0875, [1.29, 2.184, 3.0949, 4.155, 4.7249], 0.6549),
                                                 "path": run(4.176, [0.96, 1.0, 1.08, 1.21, 1.476], 0.44)}}
    assert main_job_table(doc) == [
        "| scheme | ppl @ 128 | 2x | 4x | **8x** | **16x** | 32x | far mass @ 1024 |",
        "|---|---|---|---|---|---|---|---|",
        "| rope | 4.09 | 1.29 | 2.18 | 3.09 | 4.16 | 4.72 | 0.65 |",
        "| path | 4.18 | 0.96 | 1.00 | 1.08 | 1.21 | 1.48 | 0.44 |",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["path"])
def test_the_readme_row_is_what_a_fresh_main_job_prints(scheme, tmp_path):
    """The main job's settings (`pedsl compare --out compare --threads 1`) for one scheme: each scheme is
    trained, evaluated and analysed on its own, so its row equals the full study's row, up to the spread
    measured across CPU profiles (SPREAD). PaTH is the one scheme whose row differs between them. The fresh
    run takes another profile than the README's (AVX-512) where the CPU has one: torch's, MKL's and oneDNN's
    AVX2 kernels on an AVX-512 CPU, its own (lower) instruction set elsewhere."""
    import torch

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if torch.backends.cpu.get_cpu_capability() == "AVX512":  # torch does not check an asked capability
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
    res = subprocess.run([sys.executable, "-m", "pedsl", "compare", scheme, "--out", str(tmp_path / "study"),
                          "--threads", "1", "-q"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "study" / "results.json").read_text())
    fresh = main_job_rows(doc["results"], int(doc["meta"]["context"]))[scheme]
    assert within_spread(fresh, _readme_rows()[scheme], scheme), (
        f"README: {_readme_rows()[scheme]}\nfresh:  {fresh}\nbeyond the spread across machines "
        f"(tools/readme_tables.py SPREAD); run `{MAIN_JOB}` and `python -m tools.readme_tables "
        "compare/results.json` to regenerate the table")


def test_a_row_is_compared_up_to_the_spread_across_machines():
    """PaTH's row as printed under ATEN_CPU_CAPABILITY=avx2 (4.18 ... 1.52) is within its spread of the
    README's avx512 row; a cell beyond it, or a row of a scheme measured identical everywhere, is not."""
    readme = "| path | 4.14 | 0.96 | 1.00 | 1.07 | 1.21 | 1.45 | 0.44 |"
    assert within_spread("| path | 4.18 | 0.97 | 1.00 | 1.08 | 1.24 | 1.52 | 0.43 |", readme, "path")
    assert not within_spread("| path | 4.18 | 0.97 | 1.00 | 1.08 | 1.24 | 1.75 | 0.43 |", readme, "path")
    assert SPREAD["path"] < 0.5
    assert within_spread("| rope | 4.10 | 1.29 |", "| rope | 4.09 | 1.29 |", "rope")
    assert not within_spread("| rope | 4.12 | 1.29 |", "| rope | 4.09 | 1.29 |", "rope")
    assert not within_spread("| rope | 4.09 |", "| rope | 4.09 | 1.29 |", "rope")
