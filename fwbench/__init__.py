"""fwbench: a reproducibility and benchmarking harness for attention variants, centred on
fast-weight attention (Schlag, Irie & Schmidhuber 2021).

Data flow: grid (TOML) → RunSpec → training loop → record → results store (JSONL) → report.

Rooms, each importing only from the ones before it:

- :mod:`fwbench.variants` — the attention zoo (the top-level ``variants/`` folder);
- :mod:`fwbench.tasks` — data, models and losses (the top-level ``tasks/`` folder);
- :mod:`fwbench.errors` — the harness's one user-facing error type;
- :mod:`fwbench.run` — grids, runner, launchers, training loop, checkpoints, results store;
- :mod:`fwbench.analysis` — records → tables, statistics, capacity, the claims engine;
- :mod:`fwbench.bench` — speed and memory benchmarks and the regression gate;
- :mod:`fwbench.report` — ``reports/REPORT.md`` and its figures;
- :mod:`fwbench.cli` — the ``fwbench`` command, thin over the rooms.
"""

__version__ = "0.1.0"
