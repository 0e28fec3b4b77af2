"""Measuring one call: wall time (median after warm-up), peak memory, FLOPs, and the matmul peak.

Rules (DESIGN.md, "Measuring"):

- Time: one warm-up call, then ``repeats`` timed calls, median (and min); the two sides of a
  ratio measured as a pair are timed in alternation (:func:`time_interleaved`). A call whose warm-up
  already took longer than ``long_call_s`` is not repeated: its one time is the measurement
  (``repeats = 1`` in the record), so a 30-second recurrent backward does not cost two minutes.
  On CUDA the device is synchronised before and after each call.
- Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` minus what was allocated before the
  call; on CPU the allocator's own accounting, read from ``torch.profiler`` memory events (every
  tensor allocation and free, in order; the peak of their running sum). Both count tensor bytes
  only (not the allocator's cache, not library workspaces); both are relative to the tensors
  alive before the call (the inputs), so they measure what the call itself needs.
- FLOPs: counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmul-type ops: mm, bmm,
  baddbmm, scaled_dot_product_attention, and their backward; plus the in-place baddbmm_ and
  addmm_, which it does not register), so achieved GFLOP/s = counted
  FLOPs / median time. Triangular solves and elementwise work are not counted, so the figure is
  a lower bound on the arithmetic actually done.
- Matmul peak: the best of a few fp32 n×n matmuls in the same process, the yardstick that
  achieved GFLOP/s is compared against.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

#: Calls at least this long (seconds) after the warm-up are timed once, without repeats.
LONG_CALL_S = 3.0


@dataclass
class Timing:
    """Wall-clock seconds of one call: median and min of ``repeats`` timed calls."""

    median_s: float
    min_s: float
    repeats: int


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, cpu_time: bool = False) -> float:
    clock = time.thread_time if cpu_time else time.perf_counter
    synchronize(device)
    start = clock()
    fn()
    synchronize(device)
    return clock() - start


def time_call(fn: Callable[[], object], device: torch.device, repeats: int = 3,
              long_call_s: float = LONG_CALL_S) -> Timing:
    """Median wall time of ``fn()`` (seconds) after one warm-up call.

    A call still at least ``long_call_s`` long on its second run is timed once (that second run).
    The warm-up itself is never the measurement: a first call can include one-time costs (fla's
    Triton kernels compile and autotune on it, tens of seconds), which say nothing about speed.

    Raises whatever ``fn`` raises (out-of-memory included); the caller records it.
    """
    warm_up = _timed(fn, device)
    if warm_up >= long_call_s or repeats < 1:
        second = _timed(fn, device)
        if second >= long_call_s or repeats < 1:
            return Timing(second, second, 1)
    times = [_timed(fn, device) for _ in range(repeats)]
    return Timing(statistics.median(times), min(times), repeats)


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, rounds: int = 7,
                     long_call_s: float = LONG_CALL_S, long_rounds: int = 3,
                     cpu_time: bool = False) -> dict[str, Timing]:
    """Median wall time (seconds) of each of several calls timed in turns, for a ratio between them.

    ``cpu_time``: the CPU time of the calling thread instead (``time.thread_time``; on CPU with one
    torch thread, all of a call's work): on a machine whose cores other processes share, the time
    spent waiting for a core is left out, so a deprioritised (``nice``) benchmark still measures
    its work; the others still slow it through shared caches and memory.

    One warm-up call each, then ``rounds`` rounds (at most ``long_rounds`` if a warm-up took at
    least ``long_call_s``) that call every function once, in reverse order every other round. On a
    shared machine the load drifts over seconds; timing the two sides of a ratio in alternation
    exposes both to the same drift, where back-to-back blocks of repeats can put one side in a
    slow stretch and the other in a fast one.

    Raises:
        ValueError: ``rounds`` or ``long_rounds`` < 1, or no functions.
    """
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in (rounds, long_rounds)) or not fns:
        raise ValueError(f"rounds, long_rounds, fns: got {rounds}, {long_rounds}, {len(fns)} functions; "
                         "expected rounds >= 1, long_rounds >= 1 and at least one function")
    if cpu_time and device.type != "cpu":
        raise ValueError(f"cpu_time: got True on {device}; expected a CPU device (a GPU's work is not this thread's)")
    names = list(fns)
    if max(_timed(fns[name], device, cpu_time) for name in names) >= long_call_s:
        rounds = min(rounds, long_rounds)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else reversed(names):
            times[name].append(_timed(fns[name], device, cpu_time))
    return {name: Timing(statistics.median(t), min(t), rounds) for name, t in times.items()}


@contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null: torch's profiler prints a line per start and stop
    from C++ (no log level turns it off), which would interleave with the benchmark's table."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of tensors allocated by ``fn()`` beyond those alive before it (see module doc)."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with _stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return int(peak)


def _in_place_matmul_flops(self_shape, mat1_shape, mat2_shape, *args, out_shape=None, **kwargs) -> int:
    """2·[b·]m·k·n for [(b,)] (m, k) @ (k, n): the formula torch's counter uses for baddbmm and addmm."""
    return 2 * math.prod(mat1_shape) * mat2_shape[-1]


#: In-place matmuls, which torch's counter does not register (it counts ``baddbmm`` but not
#: ``baddbmm_``): kernels that update a state in place would otherwise look to do less work.
IN_PLACE_MATMUL_FLOPS = {torch.ops.aten.baddbmm_: _in_place_matmul_flops, torch.ops.aten.addmm_: _in_place_matmul_flops}


def count_flops(fn: Callable[[], object]) -> int:
    """Matmul-type FLOPs that ``fn()`` executes, forward and backward (see module doc)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=IN_PLACE_MATMUL_FLOPS) as counter:
        fn()
    return int(counter.get_total_flops())


def matmul_peak_gflops(device: torch.device, n: int | None = None, repeats: int = 5) -> float:
    """Best GFLOP/s of an fp32 (n × n) @ (n × n) matmul on ``device`` (2n³ FLOPs per call).

    n defaults to 2048 on CPU and 8192 on CUDA: large enough to reach the BLAS plateau.
    """
    n = n or (8192 if device.type == "cuda" else 2048)
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(device)
    b = torch.randn(n, n, generator=generator).to(device)
    _timed(lambda: a @ b, device)
    best = min(_timed(lambda: a @ b, device) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure (CUDA OOM, or CPU ``MemoryError`` / alloc failure)."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "not enough memory" in text)
