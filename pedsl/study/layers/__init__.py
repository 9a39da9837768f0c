"""``pedsl compare --study layers``: per-layer schemes, windows and learned sinks past the training length.

Ten schemes (:data:`pedsl.study.layers.recipe.SCHEMES`), each trained once per seed (3 by default)
on one mixture of text and the retrieval tasks, in a 6-layer model (the tiny preset, narrowed;
``recipe.TRAIN``): full RoPE; RoPE in a 32-token sliding window in every layer; Gemma 3's 5 local
(windowed, base 10,000) : 1 global (base 1,000,000) map; Llama 4's map (RoPE inside 32-token
chunks, a global NoPE layer with Llama 4's log-position temperature every fourth layer); each of
those with a learned sink logit per head (``sink = logit``, GPT-OSS), RoPE with a learned sink
token (``sink = token``) and RoPE-ID (half of every head's channels NoPE, in every layer). The
windowed and layered schemes are the study's own files (``pedsl/study/layers/schemes/``); rope,
rope_sink, rope_sink_token and rope_id come from the library.

Every run is measured as the seeded studies measure (:func:`pedsl.study.driver.measure`):
perplexity ratio on the text corpus to 32x the training length, the retrieval tasks (passkey,
multi-key needle, key-value) to 16x at three needle depths, far attention mass, attention mass on
the first token and the share the learned sink takes (``learned_sink_mass``); the report
(:mod:`pedsl.study.seeded.report`) gives mean [min, max] over seeds. It runs through
:func:`pedsl.study.seeded.run.run_seeded`, so finished runs and measures are reused and
``--jobs`` / ``--executor`` spread the runs as in the other seeded studies.
"""
