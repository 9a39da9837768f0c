"""The default study, ``pedsl compare``: several schemes trained, evaluated and analyzed alike.

:mod:`.run` trains and measures (:func:`~pedsl.study.compare.run.run_compare`), :mod:`.report`
turns the results into the page (tables, the papers' expected direction, plots). With ``--seeds``
the same study runs once per seed through :mod:`pedsl.study.seeded`.
"""
