"""Training-free capacity probe: write S random key/value pairs into a variant's memory, read back.

For each variant (its real feature map φ and update rule, built from the registry) and each number
of pairs S: draw S random keys x_i ~ N(0, I_{d_key}) (what a random, untrained projection of random
embeddings produces) and S random values v_i ~ N(0, I_{d_v}), write all S pairs with
``attention.write`` (β = 1 for the rules that use a write strength), query the memory with every key
(``attention.read``) and measure the relative retrieval error

    error = mean_i (1 − cos²(v_i, v̂_i)),

the fraction of each value's energy that the read-out misses (0: perfect; ≈ 1: nothing retrieved).
It is scale-free, so the sum rule's normaliser and the FWM's layer norm do not bias it.

Reference: for S > d_dot no memory with d_dot columns can do better than the least-squares read-out,
which keeps only the projection of the S random values onto a d_dot-dimensional subspace, i.e. an
error of about 1 − d_dot / S. The figure draws that bound; the distance between a curve and the
bound is the interference of the rule's φ on random (untrained) keys.

Deterministic: every (variant, S) draws from a generator seeded by ``seed``. Runs in seconds on a
CPU (``fwbench probe``).
"""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from fwbench.errors import check_seed  # noqa: E402
from fwbench.report.figure_style import legend_below, plain_ticks, save  # noqa: E402
from fwbench.run.strict_json import write_csv  # noqa: E402
from fwbench.variants import build_attention, d_dot_of, parse_spec  # noqa: E402

#: Variants probed by default: every feature map of the paper with every update rule.
PROBE_VARIANTS = [
    "linear", "favor:m=64", "dpfp:nu=1", "dpfp:nu=2", "dpfp:nu=3",
    "linear-delta", "favor-delta:m=64", "dpfp-delta:nu=1", "dpfp-delta:nu=2", "dpfp-delta:nu=3",
    "tanh-fwm", "dpfp-fwm:nu=1",
]
#: Numbers of pairs, as multiples of d_dot.
PROBE_RATIOS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)
#: Size of the random values.
PROBE_D_VALUE = 64
PROBE_COLUMNS = ["variant", "rule", "d_key", "d_dot", "S", "S_over_d_dot", "trials", "error", "bound"]


def least_squares_bound(S: int, d_dot: int) -> float:
    """≈ error of the best d_dot-column linear memory for S random values: max(0, 1 − d_dot/S)."""
    return max(0.0, 1.0 - d_dot / S)


def probe_bytes(d_key: int, trials: int, variants: list[str] | None = None,
                ratios: tuple[float, ...] = PROBE_RATIOS) -> int:
    """A lower bound on the fp32 bytes the probe holds at once for its largest (variant, S): the keys
    (trials, 1, S, d_key), their features (trials, 1, S, d_dot) and the values and read-out
    (trials, 1, S, PROBE_D_VALUE), at S = max(ratios) · d_dot, plus a d_key × d_dot projection (FAVOR+'s
    Ω). Computed from the specs alone (nothing is allocated), so that ``fwbench probe`` can refuse
    a ``--d-key`` or ``--trials`` that cannot fit before it starts."""
    largest = 0
    for spec in variants or PROBE_VARIANTS:
        d_dot = d_dot_of(spec, d_key) or d_key
        S = max(2, round(max(ratios) * d_dot))
        largest = max(largest, trials * S * (d_key + d_dot + 2 * PROBE_D_VALUE) + d_key * d_dot)
    return 4 * largest


@torch.no_grad()
def probe_variant(spec: str, d_key: int = 64, ratios: tuple[float, ...] = PROBE_RATIOS, trials: int = 4,
                  seed: int = 0) -> list[dict]:
    """Relative retrieval error of ``spec`` for S = ratio · d_dot pairs (one row per distinct S).

    Raises:
        VariantError: bad spec; ValueError: a variant without a fast-weight memory (softmax);
        FwbenchError: a seed outside [0, 2**31).
    """
    check_seed(seed, "seed")  # seed 2**32 drew as seed 0, and -5 was taken (the command refused both)
    attention = build_attention(spec, d_key).eval()
    d_dot = attention.d_dot
    if d_dot is None:
        raise ValueError(f"variant: got {spec!r}; the probe needs a fast-weight memory (not softmax)")
    rule = parse_spec(spec).info.rule
    rows = []
    # ratios that round to one S at a small d_dot (S = max(2, ·) at --d-key 2) measure it once: one row per S
    for S in dict.fromkeys(max(2, round(ratio * d_dot)) for ratio in ratios):
        # modulo torch's seed range (2**64): --seed 2**63 - 1, which the command accepted before seeds were
        # bounded at 2**31, overflowed manual_seed ("Overflow when unpacking long long"); every seed that fitted
        # keeps its stream
        generator = torch.Generator().manual_seed((seed * 1_000_003 + S) % 2**64)
        torch.manual_seed(seed)  # FAVOR+ draws its features from the global RNG
        attention.redraw_features()
        keys = torch.randn(trials, 1, S, d_key, generator=generator)
        values = torch.randn(trials, 1, S, PROBE_D_VALUE, generator=generator)
        state = attention.write(keys, values, beta=torch.ones(trials, 1, S))
        read = attention.read(keys, state).float()
        cosine = torch.nn.functional.cosine_similarity(read, values, dim=-1)
        rows.append({"variant": str(parse_spec(spec)), "rule": rule, "d_key": d_key, "d_dot": d_dot, "S": S,
                     "S_over_d_dot": S / d_dot, "trials": trials, "error": (1 - cosine**2).mean().item(),
                     "bound": least_squares_bound(S, d_dot)})
    return rows


def run_probe(variants: list[str] | None = None, d_key: int = 64, ratios: tuple[float, ...] = PROBE_RATIOS,
              trials: int = 4, seed: int = 0) -> pd.DataFrame:
    """The probe for every variant; columns :data:`PROBE_COLUMNS`."""
    rows = []
    for spec in variants or PROBE_VARIANTS:
        rows += probe_variant(spec, d_key, ratios, trials, seed)
    return pd.DataFrame(rows, columns=PROBE_COLUMNS)


def probe_figure(table: pd.DataFrame, path: Path) -> Path:
    """Error rate vs S/d_dot, one panel per update rule, one line per variant; S = d_dot marked."""
    rules = [r for r in ("sum", "delta", "fwm") if r in set(table["rule"])]
    fig, axes = plt.subplots(1, len(rules), figsize=(5 * len(rules), 6.2), sharey=True, squeeze=False)
    for ax, rule in zip(axes[0], rules, strict=True):
        for variant, rows in table[table["rule"] == rule].groupby("variant", sort=True):
            rows = rows.sort_values("S_over_d_dot")
            ax.plot(rows["S_over_d_dot"], rows["error"], "o-", ms=3,
                    label=f"{variant} (d_dot {int(rows['d_dot'].iloc[0])})")
        ratio = sorted(set(table["S_over_d_dot"]))
        ax.plot(ratio, [max(0.0, 1 - 1 / r) for r in ratio], "k--", lw=1, label="least-squares bound 1 − d_dot/S")
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("pairs written / d_dot  (S / d_dot)")
        ax.set_title(f"{rule} rule")
        ax.grid(True, which="both", alpha=0.3)
        plain_ticks(ax, "x")
        legend_below(ax)  # inside, it covered linear's first points and most of the fwm panel
    axes[0][0].set_ylabel("relative retrieval error 1 − cos²(v, v̂)")
    fig.suptitle("Training-free capacity probe: random keys, no training", fontsize=10)
    return save(fig, path)


def write_probe(out_dir: Path, variants: list[str] | None = None, d_key: int = 64, trials: int = 4,
                seed: int = 0) -> tuple[Path, Path, float]:
    """Run the probe and write ``probe.csv`` and ``probe.png`` into ``out_dir``; returns the paths and seconds."""
    started = time.perf_counter()
    table = run_probe(variants, d_key, trials=trials, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / "probe.csv"
    write_csv(table, csv, index=False, float_format="%.4g")
    figure = probe_figure(table, out_dir / "probe.png")
    return csv, figure, time.perf_counter() - started
