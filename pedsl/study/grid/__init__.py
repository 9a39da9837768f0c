"""``pedsl compare --study grid``: resolution extrapolation on 2-D data.

Every scheme is trained on a grid task (:mod:`pedsl.data.grids`, ``grid_image`` by default) at
16 x 16 and evaluated on fresh grids of 16, 24, 32, 48 and 64 cells a side: accuracy on the cells a
rule determines and perplexity over every cell, mean and min-max spread over 3 seeds, plus a
picture of one query's attention over the grid per scheme. :mod:`.run` trains and measures
(through :mod:`pedsl.study.driver`), :mod:`.measure` is the evaluation of one run, :mod:`.report`
the page and its plots.
"""
