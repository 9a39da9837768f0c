"""``pedsl compare --study extension``: RoPE scaling methods applied to a trained RoPE model.

:mod:`.run` trains the base models and fine-tunes and evaluates every method (zero-shot and
fine-tuned), :mod:`.report` writes that study's page; :mod:`.seeds` runs it once per seed
(``--seeds``) and :mod:`.seeds_report` summarises the seeds.
"""
