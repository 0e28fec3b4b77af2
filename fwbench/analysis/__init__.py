"""From run records to findings: records as a pandas table (:mod:`~fwbench.analysis.records`),
statistics over seeds, memory capacity, the paper's official results as data
(:mod:`~fwbench.analysis.reference`, ``reference_data/``), and the claims engine that turns them into
verdicts (:mod:`~fwbench.analysis.claims`, :mod:`~fwbench.analysis.claims_lm`,
:mod:`~fwbench.analysis.verdicts`).

Reads records only; never trains, never draws. Imports from :mod:`fwbench.variants` (spec parsing).
"""
