"""Issue 16.6 on one GPU: fla's Triton kernels against our chunk forms, and the Setting 2 step rate.

One command, a few minutes on one H200 (most of it fla's Triton autotuning on first calls)::

    PYTHONPATH=$PWD python benchmarks/gpu_check.py            # add --no-tests to skip the pytest part

Prints, for the delta rule (the target: our dpfp-delta chunk forward within 3× of fla's
``chunk_delta_rule``) and the sum rule, at T=4096 (B=1, H=8, d_dot=128 — DPFP ν=1 at d_key 64 —,
d_v=64): forward and forward+backward milliseconds of fla (bf16) and ours (bf16 inputs, fp32
inside; and fp32), timed in turns in one process, the ratio ours/fla, and the relative RMSE of
fla's outputs, final state and gradients against ours on the same bf16 inputs. Then Setting 2 at
S=60 (batch 32, dpfp-delta ν=1 and linear, fused Adam as in a run): training steps per second, with
the harness's NaN/inf check (one host sync per attention call) on and off. Last, the fla dispatch
tests (``tests/variants/test_fla_dispatch.py``), whose CUDA cases run only here.

Runs on CPU too (``--device cpu``, for a smoke test of the script): the fla rows then say why they
are missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fwbench.bench.measure import synchronize, time_interleaved
from fwbench.run.optimization import build_optimizer
from fwbench.tasks import retrieval
from fwbench.variants import set_check_finite
from fwbench.variants.kernels import delta_rule_chunk, fla_dispatch, sum_rule_chunk

ROOT = Path(__file__).resolve().parent.parent


def relative_rmse(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, b = actual.detach().double(), expected.detach().double()
    return ((a - b).norm() / b.norm()).item()


def rule_inputs(rule: str, T: int, device: torch.device, B: int = 1, H: int = 8, d_dot: int = 128, d_v: int = 64):
    """fp32 φ-mapped inputs as the dpfp variants make them (positive; sum-normalised for the delta rule)."""
    generator = torch.Generator().manual_seed(0)

    def features(*shape):
        x = F.elu(torch.randn(*shape, generator=generator)) + 1.0
        return x / x.sum(-1, keepdim=True) if rule == "delta" else x

    q, k, v = features(B, H, T, d_dot), features(B, H, T, d_dot), torch.randn(B, H, T, d_v, generator=generator)
    tokens = [q, k, v] + ([torch.rand(B, H, T, generator=generator)] if rule == "delta" else [])
    return [x.to(device) for x in tokens]


def forward_backward(fn, inputs):
    """A closure: fn on fresh leaves, then backward of a fixed random projection of every output;
    returns the gradients of the inputs."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    cotangents: list[torch.Tensor] = []  # drawn once from a fixed seed: the same on every side

    def run():
        for leaf in leaves:
            leaf.grad = None
        outputs = [out.float() for out in fn(*leaves) if out is not None]
        if not cotangents:
            generator = torch.Generator().manual_seed(1)
            cotangents.extend(torch.randn(out.shape, generator=generator).to(out.device) for out in outputs)
        sum((out * weight).sum() for out, weight in zip(outputs, cotangents)).backward()
        return [leaf.grad for leaf in leaves]

    return run


def compare_kernels(rule: str, T: int, device: torch.device, rounds: int) -> None:
    ours_fn = sum_rule_chunk if rule == "sum" else delta_rule_chunk
    fp32 = rule_inputs(rule, T, device)
    bf16 = [x.to(torch.bfloat16) for x in fp32]
    kernels, why_not = fla_dispatch.load_fla_kernels()
    decision = fla_dispatch.decide(rule, *bf16[:3])
    print(f"\n{rule} rule, T={T}, shapes {tuple(fp32[0].shape)} / d_v {fp32[2].shape[-1]}: dispatch of bf16 -> "
          f"{decision.backend} ({decision.reason}); fp32 -> {fla_dispatch.decide(rule, *fp32[:3]).reason}")
    sides = {"ours fp32": (ours_fn, fp32), "ours bf16-in": (ours_fn, bf16)}
    if kernels is not None and device.type in fla_dispatch.FLA_DEVICE_TYPES:
        translate = fla_dispatch.fla_sum_rule_chunk if rule == "sum" else fla_dispatch.fla_delta_rule_chunk
        kernel = kernels.sum if rule == "sum" else kernels.delta
        sides["fla bf16"] = (lambda *x: translate(kernel, *x), bf16)
    else:
        print(f"  fla: not measured ({why_not or 'not on CUDA'})")
    with torch.no_grad():
        forward = time_interleaved({name: (lambda f=f, x=x: f(*x)) for name, (f, x) in sides.items()}, device, rounds)
    both = time_interleaved({name: forward_backward(f, x) for name, (f, x) in sides.items()}, device, rounds)
    for name in sides:
        print(f"  {name:13s} forward {1e3 * forward[name].median_s:8.3f} ms   forward+backward "
              f"{1e3 * both[name].median_s:8.3f} ms")
    if "fla bf16" in sides:
        for name in ("ours fp32", "ours bf16-in"):
            print(f"  ratio {name} / fla: forward {forward[name].median_s / forward['fla bf16'].median_s:6.2f}x   "
                  f"forward+backward {both[name].median_s / both['fla bf16'].median_s:6.2f}x")
        fla_out, ours_out = sides["fla bf16"][0](*bf16), ours_fn(*bf16)
        errors = [f"{label} {relative_rmse(a.float(), b.float()):.2e}"
                  for label, a, b in zip(("y", "W_T", "z_T"), fla_out, ours_out) if b is not None]
        fla_grads = forward_backward(sides["fla bf16"][0], bf16)()
        ours_grads = forward_backward(ours_fn, bf16)()
        errors += [f"d{label} {relative_rmse(a.float(), b.float()):.2e}"
                   for label, a, b in zip("qkvb", fla_grads, ours_grads)]
        print("  fla vs ours on the same bf16 inputs, relative RMSE: " + ", ".join(errors))


def setting2_steps_per_second(variant: str, S: int, batch: int, steps: int, device: torch.device,
                              check_finite: bool) -> float:
    """Training steps per second of one Setting 2 run (data drawn on the CPU and moved, as in a run)."""
    torch.manual_seed(1)
    config = retrieval.RetrievalConfig(setting=2, S=S, batch_size=batch)
    model = retrieval.RetrievalTask().build_model(config, variant).to(device)
    set_check_finite(model, check_finite)
    optimizer = build_optimizer(model, config)
    generator = torch.Generator().manual_seed(0)

    def step():
        data = {name: x.to(device, non_blocking=True) for name, x in retrieval.sample_batch(2, S, batch, generator).items()}
        loss = retrieval.retrieval_loss(model(data["keys"], data["values"], data["queries"]), data["targets"], S)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(10):  # warm-up: allocator, kernels
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--S", type=int, default=60)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-tests", action="store_true", help="skip tests/variants/test_fla_dispatch.py")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    try:
        fla_version = importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:
        fla_version = "not installed"
    print(f"device {name}, torch {torch.__version__}, fla {fla_version}, TF32 matmuls {fla_dispatch.tf32_allowed()}")
    for rule in ("delta", "sum"):
        compare_kernels(rule, args.T, device, args.rounds)
    print(f"\nSetting 2, S={args.S}, batch 32, one run, {args.steps} timed steps")
    for variant in ("dpfp-delta:nu=1", "linear"):
        for check in (True, False):
            rate = setting2_steps_per_second(variant, args.S, 32, args.steps, device, check)
            print(f"  {variant:16s} NaN/inf check {'on ' if check else 'off'}: {rate:8.1f} steps/s")
    if not args.no_tests:
        print("\ntests/variants/test_fla_dispatch.py (CUDA cases included when a GPU and fla are present):", flush=True)
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                        "tests/variants/test_fla_dispatch.py"], cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
