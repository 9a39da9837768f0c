"""``pedsl compare --study counting``: counting segments, where token distances vary.

Every scheme is trained on the counting tasks of :mod:`pedsl.data.counting` (the value after the
k-th last marker, the first letter of the k-th last sentence; segments of variable length) and
evaluated on fresh rows in distribution and with more and longer segments than in training: exact
accuracy on the answers, mean and min-max spread over 3 seeds. :mod:`.run` trains and measures
(through :mod:`pedsl.study.driver`), :mod:`.measure` is the evaluation of one run and its scorer,
:mod:`.report` the page and its plot.
"""
