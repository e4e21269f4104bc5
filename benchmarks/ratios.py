"""How sure a benchmark's median ratio is, on a shared noisy machine: a bootstrap interval.

The paired ratios of a run (each rep's ours / peer, both measured within seconds of each other)
spread widely here (0.1-1.2 around a median of 0.5 in one run of 25 reps): a median alone does
not say whether a line is met. `median_interval` resamples the reps with replacement and gives
the range the median falls in for 90 % of the resamples — a line inside it is not resolved by
that run.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

RESAMPLES = 2000


def median_interval(values: Sequence[float], *, level: float = 0.9) -> tuple[float, float]:
    """The central `level` range of the medians of `RESAMPLES` bootstrap resamples of `values`
    (seeded: the same values give the same interval)."""
    if len(values) < 2:
        only = float(values[0]) if values else float("nan")
        return only, only
    draw = random.Random(len(values))
    medians = sorted(
        statistics.median(draw.choices(values, k=len(values))) for _ in range(RESAMPLES)
    )
    tail = (1.0 - level) / 2
    return medians[int(tail * RESAMPLES)], medians[int((1.0 - tail) * RESAMPLES) - 1]


def interval_text(values: Sequence[float]) -> str:
    """`median M.MMx (90 % interval L.LL-H.HHx)` of `values`."""
    lo, hi = median_interval(values)
    return f"median {statistics.median(values):.2f}x (90 % bootstrap interval {lo:.2f}-{hi:.2f}x)"
