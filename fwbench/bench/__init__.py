"""Speed and memory measurements: the ``fwbench bench`` cases and profiles (:mod:`~fwbench.bench.suite`),
timing and peak-memory primitives (:mod:`~fwbench.bench.measure`), the official-code anchors, the
summary tables (:mod:`~fwbench.bench.summary`), the CLI subcommand (:mod:`~fwbench.bench.command`) and
the performance-regression gate behind ``nox -s bench`` (:mod:`~fwbench.bench.regression`).

Builds on :mod:`fwbench.run` (training steps, records store) and the variants; the report reads it.
"""
