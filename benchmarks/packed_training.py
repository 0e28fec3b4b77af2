"""Issue 16.2: training throughput (runs × steps/s) of R runs packed into one model against the same
R runs trained one after another, timed in turns in one process (``time_interleaved``), so that both
sides see the same load.

Both sides are the code a grid runs: "sequential" is R solo runs, each stepped by
``fwbench.run.training._Training.train_step`` (the step ``fit`` takes: its batch, the NaN/inf check,
the finiteness check of the gradient, fused Adam); "packed" is one
``fwbench.run.packing._Pack`` of the same R seeds stepped by its ``train_step``. One timed call is
``--steps`` steps of every run. The allocator is tuned as the ``fwbench`` command tunes it. Usage::

    python benchmarks/packed_training.py [--variant dpfp-delta:nu=1] [--setting 2] [--S 60] [--batch 32]
        [--runs 3] [--steps 20] [--rounds 7] [--device cpu] [--threads 1] [--cpu-time]

Prints ms per step of one run on each side, the throughput of each (runs × steps/s) and their
ratio packed/sequential (> 1: packing pays).
"""

from __future__ import annotations

import argparse

import torch

from fwbench.bench.measure import time_interleaved
from fwbench.run.allocator import tune_malloc
from fwbench.run.packing import _Pack
from fwbench.run.training import LoopState, _Training
from fwbench.tasks.retrieval import RetrievalConfig


def sequential(variant: str, config: RetrievalConfig, seeds: list[int], device: torch.device, steps: int):
    """A closure training each solo run ``steps`` steps, one run after another."""
    runs = [(_Training("retrieval", variant, config, seed, device, True, None, None), LoopState()) for seed in seeds]

    def train() -> None:
        for run, loop in runs:
            for _ in range(steps):
                if run.train_step(loop) is None:
                    raise RuntimeError(f"seed {run.seed} diverged: {loop.diverged_reason}")

    return train


def packed(variant: str, config: RetrievalConfig, seeds: list[int], device: torch.device, steps: int):
    """A closure training the pack of ``seeds`` ``steps`` steps."""
    pack = _Pack(variant, [config] * len(seeds), seeds, device, check_finite=True)
    done = [0]

    def train() -> None:
        for _ in range(steps):
            done[0] += 1
            if pack.train_step(done[0]):
                raise RuntimeError("a packed run diverged")

    return train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="dpfp-delta:nu=1")
    parser.add_argument("--setting", type=int, default=2)
    parser.add_argument("--S", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="steps of every run per timed call")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time, not wall time (a shared machine's waits left out)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_malloc()  # as the fwbench command does at start-up: freed tensors stay in the process
    device = torch.device(args.device)
    config = RetrievalConfig(setting=args.setting, S=args.S, batch_size=args.batch)
    seeds = list(range(1, args.runs + 1))
    fns = {"sequential": sequential(args.variant, config, seeds, device, args.steps),
           "packed": packed(args.variant, config, seeds, device, args.steps)}
    timings = time_interleaved(fns, device, rounds=args.rounds, cpu_time=args.cpu_time)
    run_steps = args.runs * args.steps
    print(f"{args.variant}, Setting {args.setting}, S={args.S}, batch {args.batch}, {args.runs} runs, "
          f"{args.threads} thread(s), {device}, torch {torch.__version__}")
    for name, timing in timings.items():
        print(f"{name:10s} {1e3 * timing.median_s / run_steps:7.2f} ms per run-step  "
              f"{run_steps / timing.median_s:8.1f} runs x steps/s  (median of {timing.repeats})")
    ratio = timings["sequential"].median_s / timings["packed"].median_s
    print(f"packed / sequential throughput: {ratio:.2f}x")


if __name__ == "__main__":
    main()
