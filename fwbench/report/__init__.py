"""``reports/REPORT.md`` and its figures: the document and its sections (:mod:`~fwbench.report.render`),
Markdown helpers, the figures of each section, the language-model section, the bench section, and the
training-free capacity probe.

Top room below the CLI: reads :mod:`fwbench.analysis`, :mod:`fwbench.bench` and the store; nothing
imports it but the CLI.
"""
