"""What a study measures on each of its runs (:class:`Measures`, read by :func:`pedsl.study.driver.measure`)."""

from __future__ import annotations

from dataclasses import dataclass

from pedsl.study.analyze import default_lengths


@dataclass(frozen=True)
class Measures:
    """What a study measures on each run: perplexity and tasks at ``context x multipliers`` (or the
    given ``lengths``), the retrieval tasks when ``retrieval`` (``{"depths", "samples"}``), and the
    instruments at the lengths up to ``analyze_max``. ``retrieval["max_multiplier"]``, when given, stops
    the retrieval tasks at that multiple of the training length (the perplexity goes on)."""

    multipliers: tuple[int, ...]
    windows: int
    tasks: tuple[str, ...]
    analyze_max: int
    lengths: tuple[int, ...] | None = None
    retrieval: dict | None = None

    def eval_lengths(self, context: int) -> list[int]:
        return sorted(set(self.lengths or [context * m for m in self.multipliers]))

    def retrieval_lengths(self, context: int) -> list[int]:
        lens = self.eval_lengths(context)
        top = (self.retrieval or {}).get("max_multiplier")
        return [L for L in lens if top is None or L <= context * top] or lens[:1]

    def analysis_lengths(self, context: int) -> list[int]:
        return [L for L in self.eval_lengths(context) if L <= self.analyze_max] \
            or default_lengths(context, self.analyze_max)

    def parts(self) -> list[str]:
        return ["train", "eval", "analysis"] + (["retrieval"] if self.retrieval else [])
