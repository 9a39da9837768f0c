"""Data profiling: how far the data's dependencies reach (``pedsl profile``).

:mod:`pedsl.profile.mi` the estimator, null, width and self-similarity; :mod:`pedsl.profile.sources`
the data and its coarser symbol sequences; :mod:`pedsl.profile.run` the command's work, the PI
verdict and the suggested scheme.
"""
