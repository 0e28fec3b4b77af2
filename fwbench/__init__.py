"""fwbench: a reproducibility and benchmarking harness for attention variants, centred on
fast-weight attention (Schlag, Irie & Schmidhuber 2021).

Data flow: grid (TOML) → RunSpec → training loop → record → results store (JSONL) → report.
"""

__version__ = "0.1.0"
