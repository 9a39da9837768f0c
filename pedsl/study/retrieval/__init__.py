"""``pedsl compare --study retrieval``: retrieval that is learned, past the training length.

Every scheme (default: the default study's six plus ``fox`` and ``path_fox``) is trained once per
seed with the study's recipe: a **mixture** (``recipe.MIXTURE``) of the RULER-style tasks of
:mod:`pedsl.data.tasks` (generated on the fly at the training length, needle at a random depth)
and ``copy`` rows, the loss on the answers weighted up, the answer lengths varied and a short
causal convolution over queries and keys (``recipe.TRAIN``; ``--steps``, ``--data`` and ``--set``
override both), then:

- **retrieval** (:func:`pedsl.study.retrieval.score.evaluate_retrieval` -> ``RUN/retrieval.json``): passkey, multi-key
  needle and key-value lookup at every length (1x..16x the training length) and needle depth
  (0, 0.25, 0.5, 0.75, 1), ``samples`` sequences each; ``accuracy`` = every answer digit right
  under greedy argmax (chance 1e-5), ``digit_accuracy`` (chance 0.1), ``answer_nll``;
- **perplexity** vs length (``RUN/eval.json``, as ``pedsl eval``): on passkey rows, or on the text
  corpus when ``--data`` mixes one in;
- the papers' **instruments** on the same runs (``RUN/analysis.json``: far mass, sink mass,
  sigma_1 and stable rank of the keys).

The study is driven by :func:`pedsl.study.seeded.run.run_seeded` (runs in
``DIR/runs/<scheme>/seed<k>``, reused when their settings match). The report (``DIR/report.md``, ``report.html``) gives every number as the mean over seeds with
its min-max range, every curve with a min-max band, flags differences within the spread as not
significant (n.s., against RoPE), and draws the needle-in-a-haystack heatmaps (length x depth,
one panel per scheme), accuracy vs length and vs depth, and a loss curve per run.
"""
