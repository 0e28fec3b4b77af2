"""Wall time of runs handed out to N workers: the model behind ``fwbench estimate --jobs N``.

The local launcher with ``--jobs N`` (:func:`fwbench.run.launchers.launch_local_jobs`) submits a grid's
unfinished runs to a process pool in grid order, and each worker takes the next run as soon as it is
free; ``fwbench run``/``reproduce`` run the grids one after another, each to its end. So a grid's wall
time is the greedy list schedule of its runs' times, in grid order, on N workers (not its core-hours
/ N: one long run late in the grid keeps one worker busy after the others are idle), and a sequence
of grids takes the sum of theirs. Seconds are whatever the caller's run times are (CPU seconds of a
run on a free core, in the estimate).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from fwbench.errors import FwbenchError


def makespan(run_seconds: Iterable[float], workers: int) -> float:
    """Seconds until the last of ``workers`` workers is done when the runs, taking ``run_seconds``
    each, are handed out in that order, each to the worker that is free first.

    Raises:
        FwbenchError: ``workers`` < 1, or a negative run time.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise FwbenchError(f"--jobs: got {workers!r}; expected a positive integer")
    runs = list(run_seconds)
    # workers beyond the number of runs stay idle: without the cap, --jobs 10**20 would ask for a
    # list of 10**20 free times (OverflowError, after the minutes the estimate spent timing steps)
    free_at = [0.0] * max(1, min(workers, len(runs)))  # when each worker is next free; a heap: the first free on top
    for seconds in runs:
        if seconds < 0:
            raise FwbenchError(f"run time: got {seconds}; expected seconds ≥ 0")
        heapq.heappush(free_at, heapq.heappop(free_at) + seconds)
    return max(free_at)


def grids_wall_seconds(grids: Iterable[Iterable[float]], workers: int) -> float:
    """Wall seconds of grids run one after another, each scheduled by :func:`makespan`."""
    return sum(makespan(runs, workers) for runs in grids)
