"""From run records to findings: records as a pandas table (:mod:`~fwbench.analysis.records`),
statistics over seeds (:mod:`~fwbench.analysis.statistics`, log-space intervals for losses), the one
capacity estimator (:mod:`~fwbench.analysis.capacity`), the paper's official results as data
(:mod:`~fwbench.analysis.reference`, ``reference_data/``), and the claims engine that turns them into
verdicts with evidence levels (:mod:`~fwbench.analysis.claims`, :mod:`~fwbench.analysis.claims_setting2`,
:mod:`~fwbench.analysis.claims_lm`, :mod:`~fwbench.analysis.evidence`, :mod:`~fwbench.analysis.verdicts`).

Reads records only; never trains, never draws. Imports from :mod:`fwbench.variants` (spec parsing).
"""
