"""``fwbench bench``: time and peak memory of every attention variant and form against T.

For each sequence length T of a profile, each variant (softmax, linear, FAVOR+, DPFP; sum and
delta rule) in each form (chunk, parallel, recurrent) is timed forward (no autograd) and
forward+backward (a random cotangent on the outputs, gradients for q, k, v and β), on
(B, H, T, d_head) inputs, fp32 by default. Beside them, in the same run: torch's fused causal
softmax (``scaled_dot_product_attention``), fla-core's pure-PyTorch delta-rule kernels and, on
CUDA, fla's Triton kernel (:mod:`fwbench.bench.anchors`). How each figure is measured is in
:mod:`fwbench.bench.measure`. One record per case goes to ``<results>/bench.jsonl``.

The run ends with the acceptance ratios of the issue that introduced it, each measured in this
one process (the machine may be shared: only ratios of figures taken side by side are compared):
chunk vs recurrent speed-up, delta vs sum cost, ours vs fla, achieved GFLOP/s vs the in-run
matmul peak, linear vs softmax, memory growth from T = 2048 to 16384, training throughput on the
paper's Setting 2 shape, and fp16/bf16 agreement with fp32.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from fwbench.bench import anchors as bench_anchors
from fwbench.bench.measure import (
    count_flops,
    is_out_of_memory,
    matmul_peak_gflops,
    peak_memory_bytes,
    time_call,
    time_interleaved,
)
from fwbench.bench.regression import retrieval_step
from fwbench.errors import FwbenchError
from fwbench.run.environment import describe_environment
from fwbench.run.grid import refuse_repeated_value
from fwbench.variants import DEFAULT_CHUNK_SIZE, VariantError, build_attention, parse_spec
from fwbench.variants.kernels import delta_rule_chunk
from fwbench.variants.registry import check_spec

FORWARD, FORWARD_BACKWARD = "forward", "forward+backward"
MODES = (FORWARD, FORWARD_BACKWARD)
FORMS = ("chunk", "parallel", "recurrent")
#: Every registry family once, at its default parameters (FAVOR+ m = 64, DPFP ν = 1).
VARIANTS = ("softmax", "linear", "favor", "dpfp", "linear-delta", "favor-delta", "dpfp-delta")
#: Records file of the benchmark inside the results directory.
BENCH_RECORDS = "bench.jsonl"
#: Official code's Setting 2 training throughput on the reference machine (steps/s).
OFFICIAL_SETTING2_STEPS_PER_S = 6.0
#: fp16 / bf16 forward outputs must be within this relative RMSE of the fp32 outputs.
LOW_PRECISION_TOLERANCE = {"float16": 5e-3, "bfloat16": 3e-2}


@dataclass(frozen=True)
class BenchProfile:
    """What one ``fwbench bench --profile NAME`` run measures.

    ``max_length`` caps T per form where a form's cost makes longer runs pointless or unsafe on a
    shared machine: the recurrent forms are token loops (and their backward keeps one state per
    token), the parallel forms hold T×T matrices, and softmax's recurrent KV cache grows by
    concatenation (O(T²) copies). Keys: ``recurrent``, ``parallel``, ``softmax-recurrent``,
    ``sdpa``, ``fla-recurrence``, ``fla-chunkwise``; the CUDA values replace the CPU ones there.
    """

    name: str
    description: str
    lengths: tuple[int, ...]
    max_length: dict[str, int]
    max_length_cuda: dict[str, int] = field(default_factory=dict)
    variants: tuple[str, ...] = VARIANTS
    repeats: int = 3
    #: recurrent forms run under the memory profiler only up to this T (its cost is per op)
    memory_max_recurrent: int = 1024
    #: T of the side-by-side comparison with fla at B=1, H=8, d_k=128, d_v=64
    comparison_length: int = 2048
    #: T of the fp16/bf16 agreement check (``None``: skipped)
    precision_length: int | None = 8192
    #: chunk sizes swept for dpfp and dpfp-delta at ``sweep_length`` (the default's evidence)
    chunk_sweep: tuple[int, ...] = (16, 32, 64, 128)
    sweep_length: int = 4096
    #: training steps timed on the paper's Setting 2 shape
    train_steps: int = 200
    #: (variant, setting, S) of the retrieval training steps timed one by one (batch 32): the
    #: large-S Setting 1 step and the FWM rule's Setting 2 step, the two costliest cells of the paper
    step_cases: tuple[tuple[str, int, int], ...] = (("dpfp:nu=1", 1, 600), ("softmax", 1, 600),
                                                    ("dpfp-fwm:nu=1", 2, 200))

    def cap(self, key: str, device: torch.device) -> int:
        table = {**self.max_length, **(self.max_length_cuda if device.type == "cuda" else {})}
        return table.get(key, max(self.lengths))


PROFILES: dict[str, BenchProfile] = {
    "quick": BenchProfile(
        "quick", "CPU CI: T ∈ {128, 256, 512}, every variant and form, a few seconds per variant",
        lengths=(128, 256, 512),
        max_length={"recurrent": 256, "parallel": 512, "softmax-recurrent": 256, "sdpa": 512,
                    "fla-recurrence": 256, "fla-chunkwise": 512},
        repeats=2, memory_max_recurrent=256, comparison_length=512, precision_length=512,
        chunk_sweep=(32, 64), sweep_length=512, train_steps=30,
    ),
    "full": BenchProfile(
        "full", "T ∈ {256, 1024, 2048, 4096, 16384}; recurrent forms to 4096, parallel to 2048 on CPU",
        lengths=(256, 1024, 2048, 4096, 16384),
        max_length={"recurrent": 4096, "parallel": 2048, "softmax-recurrent": 1024, "sdpa": 4096,
                    "fla-recurrence": 1024, "fla-chunkwise": 16384},
        max_length_cuda={"parallel": 4096, "sdpa": 16384, "softmax-recurrent": 4096, "fla-recurrence": 4096},
    ),
}


@dataclass
class BenchResult:
    """Records of one run (one per case), and the side measurements the ratios need."""

    session: str
    records: list[dict] = field(default_factory=list)
    extras: dict = field(default_factory=dict)


def _canonical(spec: str) -> str:
    return str(parse_spec(spec))


def _inputs(attention, B: int, H: int, T: int, d_head: int, device: torch.device, dtype: torch.dtype,
            requires_grad: bool, seed: int = 0) -> dict:
    generator = torch.Generator(device="cpu").manual_seed(seed + T)

    def tensor(*shape):
        x = torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)
        return x.requires_grad_(requires_grad)

    beta = None
    if attention.uses_beta:
        beta = torch.sigmoid(torch.randn(B, H, T, generator=generator)).to(device=device, dtype=dtype)
        beta.requires_grad_(requires_grad)
    return {"q": tensor(B, H, T, d_head), "k": tensor(B, H, T, d_head), "v": tensor(B, H, T, d_head), "beta": beta}


def _call(attention, inputs: dict, form: str, mode: str, chunk_size: int | None) -> Callable[[], object]:
    """The function one case times: a forward without autograd, or a forward and a backward."""
    if mode == FORWARD:
        def forward():
            with torch.no_grad():
                return attention(**inputs, form=form, chunk_size=chunk_size)[0]
        return forward
    leaves = [x for x in inputs.values() if x is not None]
    cotangent = {}

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        y, _ = attention(**inputs, form=form, chunk_size=chunk_size)
        if "y" not in cotangent:
            generator = torch.Generator(device="cpu").manual_seed(1)
            cotangent["y"] = torch.randn(y.shape, generator=generator).to(y)
        y.backward(cotangent["y"])
    return forward_backward


def _record(session: str, case: dict, environment: dict) -> dict:
    key = json.dumps({"session": session, **{k: case[k] for k in sorted(case) if k not in ("status",)}},
                     sort_keys=True, default=str)
    return {
        "run_id": hashlib.sha1(key.encode()).hexdigest()[:16], "kind": "bench", "session": session,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **case, "environment": environment,
    }


class _Runner:
    """Measures cases one by one and keeps their records (and prints a line each)."""

    def __init__(self, profile: BenchProfile, device: torch.device, B: int, H: int, d_head: int,
                 quiet: bool, store=None):
        self.profile, self.device, self.B, self.H, self.d_head = profile, device, B, H, d_head
        self.quiet, self.store = quiet, store
        self.result = BenchResult(session=uuid.uuid4().hex[:12])
        self.environment = describe_environment(device)
        self.fla = bench_anchors.load_fla_naive()  # (module or None, why not)
        self.peak_gflops = matmul_peak_gflops(device)
        self.result.extras["matmul_peak_gflops"] = self.peak_gflops

    def log(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def measure(self, case: dict, fn_factory: Callable[[], Callable[[], object]], flops: bool,
                memory: bool) -> dict:
        """Time (and count FLOPs and peak memory of) ``fn_factory()``; store and return the record."""
        case = {"B": self.B, "H": self.H, "d_head": self.d_head, "dtype": "float32",
                "device": str(self.device), "matmul_peak_gflops": self.peak_gflops, **case}
        try:
            fn = fn_factory()
            timing = time_call(fn, self.device, self.profile.repeats)
            case.update(status="ok", median_s=timing.median_s, min_s=timing.min_s, repeats=timing.repeats,
                        tokens_per_s=case["B"] * case["T"] / timing.median_s)
            if flops:
                # the peak is re-timed next to the kernel: on a shared machine the load at the start
                # of a long run says little about the load minutes later, when this case runs
                adjacent_peak = matmul_peak_gflops(self.device, repeats=3)
                case["gflop"] = count_flops(fn) / 1e9
                case["gflops_per_s"] = case["gflop"] / timing.median_s
                case["matmul_peak_gflops_adjacent"] = adjacent_peak
                case["fraction_of_peak"] = case["gflops_per_s"] / adjacent_peak
            if memory:
                case["peak_mem_bytes"] = peak_memory_bytes(fn, self.device)
        except Exception as exc:  # a case that fails is recorded, never hides the others
            if not is_out_of_memory(exc):
                raise
            case.update(status="oom", reason=f"{type(exc).__name__}: {str(exc)[:200]}")
        finally:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        record = _record(self.result.session, case, self.environment)
        self.result.records.append(record)
        if self.store is not None:
            self.store.append(record)
        self.log(_progress_line(record))
        return record

    def skip(self, case: dict, reason: str) -> None:
        case = {"B": self.B, "H": self.H, "d_head": self.d_head, "device": str(self.device), **case,
                "status": "skipped", "reason": reason}
        record = _record(self.result.session, case, self.environment)
        self.result.records.append(record)
        if self.store is not None:
            self.store.append(record)


def _progress_line(record: dict) -> str:
    what = f"{record['variant']:<22} {record['form']:<9} {record['mode']:<16} T={record['T']:<6}"
    if record.get("sweep") == "chunk_size":
        what += f" C={record['chunk_size']}"
    if record["status"] != "ok":
        return f"  {what} {record['status']}: {record.get('reason', '')}"
    memory = record.get("peak_mem_bytes")
    memory_text = f" {memory / 2**20:8.1f} MiB" if memory is not None else ""
    return f"  {what} {record['median_s'] * 1e3:10.2f} ms{memory_text}"


def _variant_cases(runner: _Runner, lengths: Iterable[int], variants: Iterable[str]) -> None:
    profile, device = runner.profile, runner.device
    for T in lengths:
        for spec in variants:
            attention = build_attention(spec, d_key=runner.d_head).to(device).eval()
            rule = parse_spec(spec).info.rule
            for form in FORMS:
                if rule == "softmax" and form == "chunk":
                    continue  # softmax's chunk form is its parallel form
                rule_forms = getattr(getattr(attention, "update_rule", None), "forms", FORMS)
                if form not in rule_forms:  # e.g. the FWM rule: recurrent only
                    for mode in MODES:
                        runner.skip({"variant": _canonical(spec), "rule": rule, "form": form, "mode": mode, "T": T,
                                     "d_dot": attention.d_dot, "chunk_size": None},
                                    f"the {rule} rule has no {form} form")
                    continue
                cap_key = "softmax-recurrent" if (rule == "softmax" and form == "recurrent") else form
                for mode in MODES:
                    case = {"variant": _canonical(spec), "rule": rule, "form": form, "mode": mode, "T": T,
                            "d_dot": attention.d_dot,
                            "chunk_size": DEFAULT_CHUNK_SIZE if form == "chunk" else None}
                    if form != "chunk" and T > profile.cap(cap_key, device):
                        runner.skip(case, f"{cap_key} form measured up to T={profile.cap(cap_key, device)}")
                        continue

                    def factory(attention=attention, form=form, mode=mode, T=T):
                        inputs = _inputs(attention, runner.B, runner.H, T, runner.d_head, device, torch.float32,
                                         requires_grad=mode == FORWARD_BACKWARD)
                        return _call(attention, inputs, form, mode, None)

                    memory = form != "recurrent" or T <= profile.memory_max_recurrent
                    runner.measure(case, factory, flops=form in ("chunk", "parallel"), memory=memory)
        _anchor_cases(runner, T)


def _anchor_cases(runner: _Runner, T: int) -> None:
    """SDPA and fla rows for one T, on the same shapes as the variants."""
    profile, device, B, H, d = runner.profile, runner.device, runner.B, runner.H, runner.d_head
    generator = torch.Generator(device="cpu").manual_seed(T)
    for mode in MODES:
        case = {"variant": "sdpa (torch)", "rule": "softmax", "form": "anchor", "mode": mode, "T": T, "d_dot": None}
        if T > profile.cap("sdpa", device):
            runner.skip(case, f"sdpa measured up to T={profile.cap('sdpa', device)}")
            continue

        runner.measure(case, lambda mode=mode: _sdpa_call(B, H, T, d, device, mode, generator), flops=True, memory=True)

    fla, why = runner.fla
    features = _delta_features(B, H, T, d, device, generator)
    for name, key, kernel in (("fla delta_rule_chunkwise", "fla-chunkwise", "chunkwise"),
                              ("fla delta_rule_recurrence", "fla-recurrence", "recurrence")):
        case = {"variant": name, "rule": "delta", "form": "anchor", "mode": FORWARD, "T": T, "d_dot": 2 * d}
        if fla is None:
            runner.skip(case, why)
            continue
        if T > profile.cap(key, device) or (kernel == "chunkwise" and T % 32):
            runner.skip(case, f"fla {kernel} measured up to T={profile.cap(key, device)}"
                              + (" and at T a multiple of 32" if kernel == "chunkwise" else ""))
            continue

        def fla_factory(kernel=kernel):
            call = bench_anchors.fla_chunkwise if kernel == "chunkwise" else bench_anchors.fla_recurrence

            def forward():
                with torch.no_grad():
                    return call(fla, *features)
            return forward

        runner.measure(case, fla_factory, flops=kernel == "chunkwise", memory=kernel == "chunkwise")
    if device.type == "cuda":
        _fla_triton_case(runner, T, features)


def _sdpa_call(B: int, H: int, T: int, d: int, device: torch.device, mode: str,
               generator: torch.Generator) -> Callable[[], object]:
    """torch's causal SDPA on fresh (B, H, T, d) inputs: forward without autograd, or forward+backward."""
    q, k, v = (torch.randn(B, H, T, d, generator=generator).to(device).requires_grad_(mode != FORWARD)
               for _ in range(3))
    if mode == FORWARD:
        def forward():
            with torch.no_grad():
                return bench_anchors.sdpa_causal(q, k, v)
        return forward
    cotangent = torch.randn(B, H, T, d, generator=generator).to(device)

    def forward_backward():
        for x in (q, k, v):
            x.grad = None
        bench_anchors.sdpa_causal(q, k, v).backward(cotangent)
    return forward_backward


def _delta_features(B: int, H: int, T: int, d: int, device: torch.device, generator: torch.Generator):
    """Delta-rule kernel inputs as dpfp-delta (ν = 1) makes them: sum-normalised DPFP features of
    random projections (d_k = 2d), values, β ∈ (0, 1)."""
    feature_map = build_attention("dpfp-delta:nu=1", d_key=d).feature_map
    q = feature_map.normalized(torch.randn(B, H, T, d, generator=generator)).to(device)
    k = feature_map.normalized(torch.randn(B, H, T, d, generator=generator)).to(device)
    v = torch.randn(B, H, T, d, generator=generator).to(device)
    beta = torch.sigmoid(torch.randn(B, H, T, generator=generator)).to(device)
    return q, k, v, beta


def _fla_triton_case(runner: _Runner, T: int, features) -> None:
    kernel, why = bench_anchors.load_fla_triton_chunk()
    case = {"variant": "fla chunk_delta_rule (triton, bf16)", "rule": "delta", "form": "anchor",
            "mode": FORWARD, "T": T, "d_dot": features[1].shape[-1], "dtype": "bfloat16"}
    if kernel is None:
        runner.skip(case, why)
        return
    inputs = [x.to(torch.bfloat16) for x in features]

    def factory():
        def forward():
            with torch.no_grad():
                return bench_anchors.fla_triton_chunk(kernel, *inputs)
        return forward

    runner.measure(case, factory, flops=False, memory=True)


def _chunk_sweep(runner: _Runner) -> None:
    """dpfp and dpfp-delta chunk forms at ``sweep_length`` for each chunk size: the evidence for
    :data:`variants.DEFAULT_CHUNK_SIZE`."""
    profile, device = runner.profile, runner.device
    T = profile.sweep_length
    for spec in ("dpfp", "dpfp-delta"):
        attention = build_attention(spec, d_key=runner.d_head).to(device).eval()
        for chunk_size in profile.chunk_sweep:
            for mode in MODES:
                case = {"variant": _canonical(spec), "rule": parse_spec(spec).info.rule, "form": "chunk",
                        "mode": mode, "T": T, "d_dot": attention.d_dot, "chunk_size": chunk_size,
                        "sweep": "chunk_size"}

                def factory(attention=attention, mode=mode, chunk_size=chunk_size):
                    inputs = _inputs(attention, runner.B, runner.H, T, runner.d_head, device, torch.float32,
                                     requires_grad=mode == FORWARD_BACKWARD)
                    return _call(attention, inputs, "chunk", mode, chunk_size)

                runner.measure(case, factory, flops=False, memory=False)


#: Longest T of the paired ratio measurements (the acceptance ratios are stated at T = 4096).
PAIRED_LENGTH = 4096
#: Rounds of a paired measurement and of the fla comparison (3 where one call takes 3 s or more: the recurrent backward).
PAIRED_ROUNDS = 7


def _fla_comparison(runner: _Runner) -> None:
    """Our chunk kernel and fla's ``delta_rule_chunkwise`` on identical inputs (B=1, H=8, d_k=128,
    d_v=64), timed in alternation: the times (fla at its best chunk size, 32 or 64) and the
    outputs' relative RMSE."""
    fla, why = runner.fla
    T = runner.profile.comparison_length
    extras = runner.result.extras
    if fla is None:
        extras["fla_comparison"] = {"skipped": why}
        return
    device = runner.device
    q, k, v, beta = _delta_features(1, 8, T, 64, device, torch.Generator().manual_seed(2048))  # d_k = 128
    with torch.no_grad():
        ours_y, _ = delta_rule_chunk(q, k, v, beta, chunk_size=DEFAULT_CHUNK_SIZE)
        fla_y = bench_anchors.fla_chunkwise(fla, q, k, v, beta)
        # in alternation, so that a slow stretch of a shared machine falls on both sides of the ratio
        timings = time_interleaved({
            "ours": lambda: delta_rule_chunk(q, k, v, beta, chunk_size=DEFAULT_CHUNK_SIZE),
            **{c: lambda c=c: bench_anchors.fla_chunkwise(fla, q, k, v, beta, c) for c in (32, 64)},
        }, device, rounds=max(PAIRED_ROUNDS, runner.profile.repeats))
        ours = timings.pop("ours")
        fla_times = {c: timing.median_s for c, timing in timings.items()}
    best_chunk = min(fla_times, key=fla_times.get)
    error = ((ours_y.double() - fla_y.double()).norm() / fla_y.double().norm()).item()
    extras["fla_comparison"] = {
        "T": T, "B": 1, "H": 8, "d_k": 128, "d_v": 64, "ours_s": ours.median_s, "fla_s": fla_times[best_chunk],
        "fla_chunk_size": best_chunk, "speedup": fla_times[best_chunk] / ours.median_s, "rel_rmse": error,
    }
    runner.log(f"  fla comparison T={T}: ours {ours.median_s * 1e3:.1f} ms, fla {fla_times[best_chunk] * 1e3:.1f} ms "
               f"(chunk {best_chunk}), rel RMSE {error:.1e}")


def _precision_check(runner: _Runner) -> None:
    """Forward in fp16 and bf16 against fp32 on the same inputs, for every variant (chunk form)."""
    T = runner.profile.precision_length
    if T is None:
        return
    device, rows = runner.device, []
    for spec in runner.profile.variants:
        attention = build_attention(spec, d_key=runner.d_head).to(device).eval()
        inputs = _inputs(attention, runner.B, runner.H, T, runner.d_head, device, torch.float32, False, seed=7)
        with torch.no_grad():
            reference = attention(**inputs, form="chunk")[0].double()
            for dtype in (torch.float16, torch.bfloat16):
                low = {name: None if x is None else x.to(dtype) for name, x in inputs.items()}
                y = attention(**low, form="chunk")[0]
                finite = bool(torch.isfinite(y).all())
                error = ((y.double() - reference).norm() / reference.norm()).item() if finite else math.inf
                name = str(dtype).removeprefix("torch.")
                rows.append({"variant": _canonical(spec), "dtype": name, "finite": finite, "rel_rmse": error,
                             "out_dtype": str(y.dtype).removeprefix("torch."),
                             "tolerance": LOW_PRECISION_TOLERANCE[name]})
        runner.log(f"  precision {spec:<14} T={T}: " + ", ".join(
            f"{r['dtype']} {r['rel_rmse']:.1e}" for r in rows if r["variant"] == _canonical(spec)))
    runner.result.extras["precision"] = {"T": T, "rows": rows}


def _paired_ratios(runner: _Runner) -> None:
    """The acceptance ratios between two timings, each pair re-timed in alternation, fwd+bwd:
    dpfp-delta chunk vs its recurrent form, dpfp-delta chunk vs dpfp chunk, SDPA vs linear chunk.

    The grid times every case once, minutes apart from the case it is compared with; on a shared
    machine a slow stretch can then fall on one side of a ratio only. Here both sides of a ratio
    run in turns (:func:`~fwbench.bench.measure.time_interleaved`) at T = min(4096, the profile's
    longest length and the cap of the slower form), and the acceptance ratios use these times.
    """
    profile, device, B, H, d = runner.profile, runner.device, runner.B, runner.H, runner.d_head
    longest = min(PAIRED_LENGTH, max(profile.lengths))

    def variant_call(spec: str, form: str, T: int) -> Callable[[], object]:
        attention = build_attention(spec, d_key=d).to(device).eval()
        inputs = _inputs(attention, B, H, T, d, device, torch.float32, requires_grad=True)
        return _call(attention, inputs, form, FORWARD_BACKWARD, None)

    pairs = {
        "chunk_vs_recurrent": (min(longest, profile.cap("recurrent", device)),
                               ("dpfp-delta", "recurrent"), ("dpfp-delta", "chunk")),
        "delta_vs_sum": (longest, ("dpfp-delta", "chunk"), ("dpfp", "chunk")),
        "sdpa_vs_linear": (min(longest, profile.cap("sdpa", device)), ("sdpa", "anchor"), ("linear", "chunk")),
    }
    results = {}
    for name, (T, first, second) in pairs.items():
        try:
            calls = {}
            for spec, form in (first, second):
                generator = torch.Generator(device="cpu").manual_seed(T)
                calls[f"{spec} {form}"] = (_sdpa_call(B, H, T, d, device, FORWARD_BACKWARD, generator)
                                           if spec == "sdpa" else variant_call(spec, form, T))
            timings = time_interleaved(calls, device, PAIRED_ROUNDS)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise  # a failing kernel is a bug to see, not a ratio to skip
            # out of memory on a small device: the grid's times (or its OOM records) stand
            results[name] = {"T": T, "skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
            continue
        (first_name, first_t), (second_name, second_t) = timings.items()
        rounds = first_t.repeats
        results[name] = {"T": T, "first": first_name, "second": second_name, "first_s": first_t.median_s,
                         "second_s": second_t.median_s, "rounds": rounds, "ratio": first_t.median_s / second_t.median_s}
        runner.log(f"  paired {name} T={T}: {first_name} {first_t.median_s * 1e3:.1f} ms, {second_name} "
                   f"{second_t.median_s * 1e3:.1f} ms, ratio {results[name]['ratio']:.2f} ({rounds} rounds in turns)")
    runner.result.extras["paired"] = results


#: Training steps of the Setting 2 measurement that are warm-up (allocator, caches), not timed.
TRAINING_WARMUP_STEPS = 10


def _training_throughput(runner: _Runner) -> None:
    """Steps/s of the generic training loop on the paper's Setting 2 shape (dpfp-delta ν = 1,
    S = 60, sequence length 120, batch 32), default (fastest) form.

    Like every other time of the bench, the figure is 1 / the median step time after warm-up (the
    time between consecutive steps of ``fit``'s loop: batch, forward, backward, optimiser); on a
    shared machine the median ignores the steps another process slowed down. The plain mean
    (steps / training time, warm-up included) is recorded beside it.
    """
    from fwbench.run.training import fit
    from fwbench.tasks.retrieval import RetrievalConfig

    steps = runner.profile.train_steps
    config = RetrievalConfig(setting=2, S=60, batch_size=32, eval_every=10**9, max_steps=steps)
    ends: list[float] = []

    def step_ended(step: int, loss: float) -> None:
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        ends.append(time.perf_counter())

    result = fit("retrieval", "dpfp-delta:nu=1", config, seed=1, device=runner.device, on_progress=step_ended)
    step_times = [b - a for a, b in zip(ends[TRAINING_WARMUP_STEPS:], ends[TRAINING_WARMUP_STEPS + 1:])]
    mean_rate = result.steps / result.train_s
    rate = 1 / statistics.median(step_times) if step_times else mean_rate
    runner.result.extras["setting2_training"] = {
        "steps": result.steps, "train_s": result.train_s, "steps_per_s": rate, "mean_steps_per_s": mean_rate,
        "timed_steps": len(step_times), "form": config.form, "threads": torch.get_num_threads(),
        "official_steps_per_s": OFFICIAL_SETTING2_STEPS_PER_S,
    }
    runner.log(f"  Setting 2 training: {rate:.1f} steps/s (median step of {len(step_times)} after "
               f"{TRAINING_WARMUP_STEPS} warm-up; mean {mean_rate:.1f} over all {result.steps}) "
               f"({torch.get_num_threads()} thread(s))")


def _step_times(runner: _Runner) -> None:
    """Seconds per training step (loss, backward, Adam; batch 32) of the profile's ``step_cases``:
    median of ``repeats`` steps after one warm-up, or the second step alone where a step takes
    3 s or more (:func:`~fwbench.bench.measure.time_call`)."""
    rows = []
    for variant, setting, S in runner.profile.step_cases:
        step = retrieval_step(variant, setting, S, device=runner.device)
        timing = time_call(step, runner.device, runner.profile.repeats)
        rows.append({"variant": variant, "setting": setting, "S": S, "batch": 32, "step_s": timing.median_s,
                     "repeats": timing.repeats})
        runner.log(f"  training step {variant} Setting {setting} S={S}: {timing.median_s * 1e3:.0f} ms "
                   f"({timing.repeats} timed)")
    runner.result.extras["step_times"] = rows


#: Tensors of shape (B, H, T, d_head) every case holds at once at least: q, k, v and the output.
CASE_TENSORS = 4


def device_memory_bytes(device: torch.device) -> int:
    """Total memory of ``device``: the GPU's, or this machine's physical memory for a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def max_length(device: torch.device, B: int, H: int, d_head: int) -> int:
    """The longest T whose :data:`CASE_TENSORS` fp32 tensors (B, H, T, d_head) fit in the device's
    memory: a longer ``--lengths`` is refused at once, where it raised a traceback from the first
    case (``--lengths 9223372036854775807``: "Storage size calculation overflowed") or ran out of
    memory part-way through the suite."""
    return device_memory_bytes(device) // (CASE_TENSORS * B * H * d_head * 4)


def run_bench(profile: str | BenchProfile, device: torch.device, store=None, variants: Iterable[str] | None = None,
              lengths: Iterable[int] | None = None, B: int = 2, H: int = 8, d_head: int = 64,
              quiet: bool = False, extras: bool = True) -> BenchResult:
    """Run a benchmark profile on ``device``; append each record to ``store`` (if given).

    Raises:
        FwbenchError: an unknown profile, variant, a non-positive length or one longer than
            :func:`max_length`; then a ``store`` that cannot be written. Options are checked before the
            store is touched: a refused call leaves no empty bench.jsonl or bench.lock behind.
    """
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise FwbenchError(f"--profile: got {profile!r}; expected one of {', '.join(PROFILES)}")
        profile = PROFILES[profile]
    chosen = tuple(variants) if variants else profile.variants
    for spec in chosen:
        parse_spec(spec)  # VariantError names the bad spec
        try:  # and the feature map's own checks (FAVOR+'s m, DPFP's ν) before the matmul peak is timed
            check_spec(spec, d_head)
        except VariantError as exc:
            raise FwbenchError(f"--variants: {spec} at d_head {d_head}: {exc}") from None
    chosen_lengths = tuple(lengths) if lengths else profile.lengths
    if any(not isinstance(T, int) or T < 1 for T in chosen_lengths):
        raise FwbenchError(f"--lengths: got {list(chosen_lengths)}; expected positive integers")
    # a repeated value measured its cases twice, and the summary's memory growth then failed on a traceback
    # (`--variants linear linear`: "The truth value of a Series is ambiguous")
    refuse_repeated_value("--variants", list(chosen), [str(parse_spec(spec)) for spec in chosen], "")
    refuse_repeated_value("--lengths", list(chosen_lengths), list(chosen_lengths), "")
    longest = max_length(device, B, H, d_head)
    if max(chosen_lengths) > longest:
        raise FwbenchError(f"--lengths: got {max(chosen_lengths)}; expected at most {longest} on {device} (its q, k, v "
                           f"and output, (B={B}, H={H}, T, d_head={d_head}) fp32, would not fit in its memory)")
    if store is not None:  # after the options: a refused command leaves the results directory as it was
        # a file or read-only --results-dir: refused before the matmul peak is timed (a bench store claims no run)
        store.check_writable(claims=False)
    runner = _Runner(profile, device, B, H, d_head, quiet, store)
    if runner.fla[0] is None:
        runner.log(f"  fla anchors skipped: {runner.fla[1]}")
    runner.log(f"bench [{profile.name}] on {device}: matmul peak {runner.peak_gflops:.1f} GFLOP/s (fp32), "
               f"{torch.get_num_threads()} thread(s)")
    _variant_cases(runner, chosen_lengths, chosen)
    if extras:
        _chunk_sweep(runner)
        _fla_comparison(runner)
        _paired_ratios(runner)
        _precision_check(runner)
        _training_throughput(runner)
        _step_times(runner)
    return runner.result
