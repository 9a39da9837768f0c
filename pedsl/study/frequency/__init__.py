"""``pedsl compare --study frequency``: does the data's dependency width set the RoPE frequency used?

The law under test (the frequency-usage paper): with dependencies of width W the frequencies a
model uses concentrate near ``theta* = c / W`` (the paper fits c = 3.02, close to pi). The study
trains RoPE on a task with a single dependency distance W for a sweep of widths and seeds,
measures the energy-weighted log-mean frequency of each run, and fits ``ln theta = a + s ln W``
(the law: slope ``s = -1``, ``c = exp(a)``).

**The measure: positional energy.** The per-pair energy ``|q^(k)|^2 |k^(k)|^2`` of
:func:`pedsl.study.instruments.frequency_energy` counts every use of a pair, and content
channels (which match letters, not distances) dominate it: a probe with it gave a slope of only
-0.17 per ln B. Here each pair's contribution to the raw score is split into its part that depends
on the distance alone. With ``z_q = q_c1 + i q_c2`` and ``z_k`` likewise (before rotation), pair k
adds ``Re(z_q(i) conj(z_k(j)) e^{i w_k d})`` to the score of ``(i, j)``, ``d = i - j``. Averaged over
content - the batch and every query at distance d - that is ``m_k(d) = Re(G_k(d) e^{i w_k d})``
with ``G_k(d) = mean_{b, i} z_q(i) conj(z_k(i - d))`` (one FFT cross-correlation). The **positional
energy** of pair k is the variance of ``m_k(d)`` over the causal pairs (weights ``L - d``): the
energy of the distance-dependent part of the scores. Content matching between unrelated tokens averages out of ``G``
(random letters have no preferred phase); a constant bias (``w_k d`` ~ 0 over the window) has no
variance. Energies are summed over layers and heads (heads that use position dominate, idle ones
add little), normalised over pairs, and ``ln theta_run = sum_k E_k ln w_k``. The all-channel
energy is kept beside it (``all_channel_log_freq``) so the two can be compared.

**The tasks.** Default ``topic`` (:func:`pedsl.data.synthetic.topic_batch`), closest to the paper's latent
blocks: blocks of W tokens drawn from a per-block random set of 4 letters, so a token is best
predicted from the letters of the recent ~W tokens - a smooth, box-shaped kernel of width W (its
"copy accuracy" is the share of predictions that are a letter already seen in the block). The
letters carry no content beyond the block they belong to. ``--set task=lag``
(:func:`pedsl.data.synthetic.lag_batch`) is a *sharp* kernel: every letter repeats the letter W
back with probability 1/2, else it is a fresh random letter. Letters carry no content beyond the
copy, and every position can use the dependency, so the only thing to learn is "look W back": a
purely positional attention pattern with a dense training signal. ``--set task=blocks`` uses the
block task instead (:func:`pedsl.data.synthetic.block_batch`: the last letter of each unmarked block of B
copies its first, ``W = B - 1``); there the signal is one position in B and the block phase must be
inferred, and measured here a 1-layer model stayed at chance (copy accuracy 0.00-0.04 for B = 8,
32, 128 after 200 steps), so it has nothing to measure at this budget. The copy accuracy (the share
of predictions equal to the token W back) and the loss there are recorded per run, and the law is
also fitted on the runs that learned the copy (accuracy >= 0.5).

Measured here (docs/studies/frequency.md): the smooth kernel follows the law (peak slope -1.04 +- 0.12), the sharp
lag does not (-0.16): "exactly W back" is best told apart from W +- 1 by the fastest pairs,
whatever W is.

Modules: :mod:`.measure` (positional energy of a run), :mod:`.fit` (the law's fit), :mod:`.plot`,
:mod:`.report` (frequency.md) and :mod:`.run` (the study and its CLI).

Layout: ``DIR/runs/<task><width>_s<seed>/`` (pedsl.train runs, reused when finished),
``DIR/frequency.json``, ``DIR/frequency.png|svg``, ``DIR/frequency.md``.
"""
