"""Training and evaluation data: the text corpora (:mod:`pedsl.data.corpus`), the synthetic
generators (:mod:`pedsl.data.synthetic`), the RULER-style retrieval tasks (:mod:`pedsl.data.tasks`)
and the training stream with its mixtures (:mod:`pedsl.data.stream`)."""
