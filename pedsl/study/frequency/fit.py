"""The fit of the frequency law ``theta = c / W`` (see :mod:`pedsl.study.frequency`)."""

from __future__ import annotations

import math

import numpy as np

from pedsl.errors import ConfigError


def fit_law(W: np.ndarray, theta: np.ndarray, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """OLS of ``ln theta`` on ``ln W`` and the constant ``c`` of ``theta = c / W``.

    Returns the slope with its standard error and a bootstrap 95% interval (resampling runs), the
    intercept, ``c_free = exp(intercept)``, and ``c`` = the geometric mean of ``theta * W`` (the law's
    slope -1 imposed) with its bootstrap 95% interval, and ``r2``.
    """
    x, y = np.log(np.asarray(W, float)), np.log(np.asarray(theta, float))
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        raise ConfigError("the frequency law needs at least 3 runs over at least 2 widths",
                          hint="run more widths or seeds")
    slope, icpt = np.polyfit(x, y, 1)
    res = y - (icpt + slope * x)
    se = math.sqrt(float(res @ res) / (n - 2) / float(((x - x.mean()) ** 2).sum())) if n > 2 else float("nan")
    r2 = 1 - float(res @ res) / float(((y - y.mean()) ** 2).sum()) if np.ptp(y) > 0 else float("nan")
    rng = np.random.default_rng(seed)
    slopes, cs = [], []
    for _ in range(n_boot):
        i = rng.integers(0, n, n)
        cs.append(math.exp(float((y[i] + x[i]).mean())))
        if np.ptp(x[i]) > 0:
            slopes.append(float(np.polyfit(x[i], y[i], 1)[0]))
    ci = lambda v: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]  # noqa: E731
    return {"slope": float(slope), "slope_se": se, "slope_ci95": ci(slopes), "intercept": float(icpt),
            "c_free": math.exp(float(icpt)), "c": math.exp(float((y + x).mean())), "c_ci95": ci(cs),
            "r2": r2, "runs": n}
