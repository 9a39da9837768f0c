"""The seeded studies: ``pedsl compare --seeds 0,1,2`` (the default study over seeds) and
``pedsl compare --study retrieval``.

:mod:`.run` trains and measures every scheme once per seed through :mod:`pedsl.study.driver`;
:mod:`.report` gives every number as mean [min, max] over the seeds, with :mod:`.plots` and the
series of :mod:`.series`.
"""
