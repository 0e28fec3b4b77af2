"""Values of the analysis modules that the last mutation pass left unchecked (issue 14 item 14):
the columns of the capacity tables, the skipped blips of a seed, a one-seed description, the
format of a short interval and the precision of :func:`t_interval`. Each value is worked out by hand
in the test's docstring or comments."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from fwbench.analysis.capacity import (
    CAPACITY_COLUMNS,
    SEED_COLUMNS,
    capacity_intervals,
    describe,
    seed_capacities,
)
from fwbench.analysis.statistics import Interval, t_interval


def _curve(seed: int, losses: list[float], S: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"variant": "delta", "d_key": 16, "d_dot": 32, "seed": seed, "S": S,
                         "best_eval_loss": losses, "status": "converged"})


def test_capacity_tables_of_no_rows_keep_every_column():
    """No rows: both tables are empty but keep their columns (readers index them by name)."""
    assert list(seed_capacities(pd.DataFrame()).columns) == SEED_COLUMNS
    assert list(capacity_intervals(pd.DataFrame()).columns) == [c for c in CAPACITY_COLUMNS if c != "setting"]


def test_seed_and_interval_rows_carry_their_d_key_and_d_dot():
    """Two seeds of one (variant, d_key 16, d_dot 32) cell: every seed row and the summary row name
    that d_key and d_dot, and capacity_over_d_dot divides by 32."""
    S = [10, 20, 40]
    rows = pd.concat([_curve(0, [0.001, 0.001, 0.1], S), _curve(1, [0.001, 0.1, 0.1], S)])
    per_seed = seed_capacities(rows)
    assert list(per_seed["d_key"]) == [16, 16] and list(per_seed["d_dot"]) == [32, 32]
    summary = capacity_intervals(rows).iloc[0]
    assert (summary["d_key"], summary["d_dot"], summary["n_seeds"]) == (16, 32, 2)
    # seed 0 crosses 0.01 halfway (in log-loss) from S=20 to S=40: 30; seed 1 from 10 to 20: 15
    assert summary["capacity_mean"] == 22.5
    assert summary["capacity_over_d_dot"] == 22.5 / 32


def test_two_skipped_blips_of_a_seed_are_listed_with_a_space():
    """S = 10..60 failing at 20, 40 (each followed by a retrieving S) and at 60 (the last S): the
    blips 20 and 40 are skipped and listed as '20 40'."""
    S = [10, 20, 30, 40, 50, 60]
    rows = _curve(0, [0.001, 0.5, 0.001, 0.5, 0.001, 0.5], S)
    assert seed_capacities(rows)["ignored_S"].iloc[0] == "20 40"
    assert capacity_intervals(rows)["ignored_S"].iloc[0] == "20 40"


def test_a_one_seed_row_is_described_with_its_grid_even_when_it_carries_bounds():
    """A one-seed row is '≈ 25 (1 seed; grid 16–32)' (the docstring's example), also when the row
    stores the point itself as its bounds (as :meth:`CapacityEstimate.from_row` reads a one-seed
    row): one seed has no interval to show, and never reads '(1 seeds)'."""
    row = pd.Series({"capacity_mean": 25.0, "ci_low": 25.0, "ci_high": 25.0, "bound": "", "n_seeds": 1,
                     "grid_low": 16.0, "grid_high": 32.0, "ignored_S": "", "n_diverged": 0})
    assert describe(row) == "≈ 25 (1 seed; grid 16–32)"


def test_an_interval_below_one_is_printed_with_three_significant_digits():
    """Values in [1e-3, 1) print with 3 significant digits, from 1 on with 4."""
    assert str(Interval(0.12345, math.nan, math.nan, 1)) == "0.123 (1 seed)"
    assert str(Interval(12.345, math.nan, math.nan, 1)) == "12.35 (1 seed)"


def test_t_interval_computes_in_float64_whatever_the_values_dtype():
    """float32 values (a float32 column, a tensor's ``.numpy()``): 2^24 + 1 + 1 in float32 rounds back
    to 2^24, so a float32 mean would be 5592405.33; the float64 mean is (2^24 + 2) / 3 = 5592406."""
    values = [np.float32(2.0**24), np.float32(1.0), np.float32(1.0)]
    interval = t_interval(values)
    assert interval.mean == (2.0**24 + 2) / 3
    assert isinstance(interval.mean, float)
    sample_std = math.sqrt(2 * ((2.0**24 + 2) / 3 - 1) ** 2 / 2 + ((2.0**24 + 2) / 3 - 2.0**24) ** 2 / 2)
    assert math.isclose(interval.half_width, stats.t.ppf(0.975, 2) * sample_std / math.sqrt(3), rel_tol=1e-12)
