"""Before/after of the FWM rule's backward (issue 16 item 5): one Setting 2 training step of
dpfp-fwm (retrieval model, S = 200: 400 tokens, batch 32, d_key 64), timed interleaved in one
process with the FWM kernels of another checkout (today's autograd of the plain loop) and of this
one. Usage: ``python benchmarks/compare_fwm_backward.py OLD/variants/kernels/fwm_rule.py [S] [rounds]``
(the old file: ``git show a1a73ef^:variants/kernels/fwm_rule.py > /tmp/fwm_before.py``).
Prints the median seconds per step of each and their ratio."""

from __future__ import annotations

import importlib.util
import sys

import torch

from fwbench.bench.measure import time_interleaved
from fwbench.tasks.retrieval import RetrievalModel, retrieval_loss, sample_batch
from fwbench.variants.rules import fwm as fwm_rule_module


def load_kernels(path: str):
    spec = importlib.util.spec_from_file_location("fwm_rule_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(old_path: str, S: int = 200, rounds: int = 3) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = RetrievalModel("dpfp-fwm", S, d_key=64)
    batch = sample_batch(2, S, 32, torch.Generator().manual_seed(0))
    kernels = {"before": load_kernels(old_path), "after": fwm_rule_module.kernels}

    def step(name: str):
        def run():
            fwm_rule_module.kernels = kernels[name]  # the FWM rule looks its kernels up at call time
            model.zero_grad()
            predicted = model(batch["keys"], batch["values"], batch["queries"])
            retrieval_loss(predicted, batch["targets"], S).backward()
        return run

    timings = time_interleaved({name: step(name) for name in kernels}, torch.device("cpu"), rounds=rounds,
                               long_rounds=rounds)
    fwm_rule_module.kernels = kernels["after"]
    for name, timing in timings.items():
        print(f"{name}: median {timing.median_s:.3f} s/step (min {timing.min_s:.3f}, {timing.repeats} rounds)")
    print(f"ratio before/after: {timings['before'].median_s / timings['after'].median_s:.1f}x")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
