"""Issue 16.4: a Setting 1 training step at large S before and after the code-free one-hot read,
timed in turns in one process (``time_interleaved``), so that both sides see the same load.

"Before" is ``tasks/retrieval.py`` as of a given commit (default: the last one that gathered rows of
an (S × S) identity per token), loaded from git into its own module; "after" is the working tree's.
Both models are built from one seed and trained on the same batches, as in a run (its fused Adam at
lr 1e-3, the NaN/inf check on, the allocator tuned as the ``fwbench`` command tunes it;
``FWBENCH_MALLOC_TUNING=0`` measures with glibc's defaults, as the issue's first figures were). Usage::

    python benchmarks/large_s_step.py [--before COMMIT] [--S 600] [--batch 32] [--rounds 7] [--cpu-time] [VARIANT ...]

Prints ms per step for each side and the ratio before/after (> 1: faster now).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from fwbench.bench.measure import time_interleaved
from fwbench.run.allocator import tune_malloc
from fwbench.run.optimization import build_optimizer
from fwbench.tasks import retrieval as after_module
from fwbench.variants import set_check_finite

ROOT = Path(__file__).resolve().parent.parent


def load_module_at(commit: str, path: str, name: str):
    """Import ``path`` as it is at ``commit`` under the module name ``name``."""
    source = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def training_step(module, variant: str, S: int, batch: int):
    """A closure doing one training step of ``module.RetrievalModel`` on a fresh Setting 1 batch."""
    torch.manual_seed(1)
    model = module.RetrievalModel(variant, S=S, d_key=64)
    set_check_finite(model, True)
    optimizer = build_optimizer(model, after_module.RetrievalConfig(S=S, batch_size=batch))  # as a run: fused Adam
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        data = module.sample_batch(1, S, batch, generator)
        predicted = model(data["keys"], data["values"], data["queries"])
        loss = module.retrieval_loss(predicted, data["targets"], S)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=["dpfp:nu=1", "softmax"])
    parser.add_argument("--before", default="a696e42", help="commit whose tasks/retrieval.py is 'before'")
    parser.add_argument("--S", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time, not wall time (a shared machine's waits left out)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tune_malloc()  # as the fwbench command does at start-up (FWBENCH_MALLOC_TUNING=0: off)
    before_module = load_module_at(args.before, "tasks/retrieval.py", "retrieval_before")
    print(f"Setting 1, S={args.S}, batch {args.batch}, one thread, torch {torch.__version__}; before = {args.before}")
    for variant in args.variants:
        fns = {"before": training_step(before_module, variant, args.S, args.batch),
               "after": training_step(after_module, variant, args.S, args.batch)}
        timings = time_interleaved(fns, torch.device("cpu"), rounds=args.rounds, cpu_time=args.cpu_time)
        before, after = timings["before"].median_s, timings["after"].median_s
        print(f"{variant:12s} before {1e3 * before:7.1f} ms/step  after {1e3 * after:7.1f} ms/step  "
              f"ratio {before / after:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
