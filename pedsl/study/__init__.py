"""Evaluation past the training length, the papers' instruments, and the `compare` study.

- :func:`evaluate_run` (``pedsl eval``): perplexity and its ratio to the training length,
  passkey and block retrieval vs length -> RUN/eval.json (:mod:`.eval_run`, :mod:`.perplexity`,
  :mod:`.retrieval`).
- :func:`analyze_run` (``pedsl analyze``): far mass, sink mass, score decoherence, frequency
  energy, key/query geometry per layer and head -> RUN/analysis.json (:mod:`.analyze`,
  :mod:`.instruments`; definitions in docs/semantics.md §7 and the instruments docstring).
- :func:`run_compare` (``pedsl compare``): train, evaluate and analyze several schemes with the
  same data, seed and budget, and write DIR/report.md and DIR/report.html with tables and plots.

Every study is a subpackage that runs and reports apart: :mod:`.compare` (the default study),
:mod:`.seeded` (``--seeds`` and the retrieval study), :mod:`.retrieval`, :mod:`.extension` and
:mod:`.frequency`. What they share: :mod:`.driver` (reuse the run or train it, then evaluate,
score and analyze it), :mod:`.common` (opening runs, JSON, provenance), :mod:`.page` (the one
page model and its Markdown / HTML writer), :mod:`.plots`, :mod:`.seeds` (mean and spread over seeds).
"""

from __future__ import annotations

__all__ = ["analyze_run", "evaluate_run", "run_compare"]


def __getattr__(name: str):
    if name == "evaluate_run":
        from pedsl.study.eval_run import evaluate_run

        return evaluate_run
    if name == "analyze_run":
        from pedsl.study.analyze import analyze_run

        return analyze_run
    if name == "run_compare":
        from pedsl.study.compare.run import run_compare

        return run_compare
    raise AttributeError(name)
