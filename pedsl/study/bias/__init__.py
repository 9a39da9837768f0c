"""``pedsl compare --study bias``: do the learned distance biases extrapolate flatter than T5 and ALiBi?

FIRE (Li et al., 2024) and KERPLE (Chi et al., 2022) report perplexity that stays flatter past the
training length than T5's learned bucket table and ALiBi's fixed slopes. The study trains the
library's distance-bias schemes (``recipe.SCHEMES``: ALiBi, T5, both KERPLE variants and FIRE; any
other scheme, such as ``sandwich`` or ``rope``, by name) with one budget (``recipe.TRAIN``), once per seed (default 0, 1, 2), on the
text corpus, and measures every run as the default study does (perplexity ratio ppl(L) / ppl(L_train)
at 1x..32x, the instruments), through :func:`pedsl.study.seeded.run.run_seeded`: runs in
``DIR/runs/<scheme>/seed<k>``, reused when their settings match.

Its report is the seeded report (every number mean [min, max] over the seeds, the ratio curves with
min-max bands) plus the claims table of :mod:`pedsl.study.bias.claims`: for every claimant (FIRE,
KERPLE log, KERPLE power) against every baseline (T5, ALiBi) and every length past the training
length, whether its ratio is lower than the baseline's beyond the seed spread (ranges apart), within
it, or higher.
"""
