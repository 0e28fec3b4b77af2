"""Performance regression tracking: machine-independent benchmark figures against a baseline.

A benchmark's wall time depends on the machine; its time divided by the time of a fixed
calibration workload (an fp32 matmul, :func:`calibration_workload`) measured in the same
session, in turns with it, mostly does not. That ratio is what is stored and compared: a
committed baseline (``results/baselines/perf_baseline.json``) holds one ratio per benchmark, and
a benchmark whose ratio exceeds its baseline ratio by more than a threshold is a regression.

Two uses:

- ``nox -s bench``: the pytest-benchmark suite in ``benchmarks/`` (every case in
  :data:`PERF_CASES`, threshold :data:`FULL_THRESHOLD`); ``nox -s bench -- --short`` runs the
  CI subset with :data:`GROSS_THRESHOLD`; ``-- --update-baseline`` rewrites the baseline.
How the ratio is measured (:func:`paired_ratio`): the calibration and the case are timed in
alternation, one call each per round, in CPU time of the calling thread (:func:`cpu_seconds`;
torch runs one thread, inline), and the figure is the median over rounds of each round's case
time / calibration time. On a shared machine the wall time of a call is mostly how much of a core
the scheduler gave it (with 7 runnable processes on 2 cores, about a quarter, varying by the
second): a calibration timed once before the case could land in a quiet stretch and the case in a
busy one (a case flagged 1.64× slower while it ran faster than its baseline). CPU time leaves out
the time the thread waited for a core; paired rounds expose both sides to the same cache and
memory contention; the median ignores the rounds where a burst hit only one of them. What is
left: a stretch of memory contention from the other core slows a memory-bound case more than the
compute-bound calibration, for a whole measurement. So a measurement past the threshold is
repeated (:data:`CONFIRMATIONS` times at most, a second apart) and the smallest ratio is judged
(:func:`confirmed_ratio`): a slower kernel is slower in every repetition, a busy stretch rarely
lasts through all of them.

- ``tests/bench/test_bench.py`` (run by CI through ``nox -s tests``): the short cases, measured with
  :func:`measure_ratio`, against the same baseline with the gross threshold — it catches a chunk
  form falling back to the token loop (tens of times slower), not a 20 % drift.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fwbench.run.store import blocking_file, describe_loop, link_chain, loop_entry, special_file
from fwbench.run.strict_json import strict_dumps

#: The committed baselines, one file per CPU (``environment.cpu_identity``: the model name, family and
#: model, torch's instruction set; :func:`~fwbench.run.environment.cpu_identity`): a ratio is
#: machine-independent only up to the machine's balance of matmul and memory speed (the cases measured
#: 0.31-0.99x their Intel Xeon ratios on an AMD EPYC, and 1.05-1.48x the ratios of another "AMD EPYC" on a
#: family 25 model 17 one), so each CPU is judged against its own baseline.
BASELINE_DIR = Path(__file__).resolve().parents[2] / "results" / "baselines"
#: The first baseline (an Intel Xeon), and the one judged against on a CPU that has none.
BASELINE_PATH = BASELINE_DIR / "perf_baseline.json"
#: ``nox -s bench`` fails when a ratio is more than this many times its baseline.
FULL_THRESHOLD = 1.5
#: The short CI check fails only past this factor (noisy shared runners; gross regressions only).
GROSS_THRESHOLD = 5.0
#: n of the calibration matmul (n × n) @ (n × n), fp32.
CALIBRATION_N = 768


def check_threshold(threshold: float) -> float:
    """``threshold`` (``--threshold`` of the gate), checked before any case runs: ``compare`` refuses a
    factor ≤ 1 or NaN, which then failed every case with a ValueError traceback after its timing and
    confirmations (minutes), and ``inf`` let every slowdown pass (a planted one too).

    Raises:
        ValueError: not a finite number > 1, naming the option.
    """
    if not (math.isfinite(threshold) and threshold > 1):
        raise ValueError(f"--threshold: got {threshold!r}; expected a finite factor > 1 (a case fails when its "
                         "ratio is more than that many times its baseline)")
    return threshold


def calibration_workload() -> Callable[[], object]:
    """The fixed yardstick: an fp32 (768 × 768) @ (768 × 768) matmul on fixed inputs (CPU)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(CALIBRATION_N, CALIBRATION_N, generator=generator)
    b = torch.randn(CALIBRATION_N, CALIBRATION_N, generator=generator)
    return lambda: a @ b


#: Rounds of a paired ratio: calibration and case timed in turns, one call each per round.
PAIRED_RATIO_ROUNDS = 9


#: Repetitions of a measurement past the threshold before it is judged a regression, and the
#: pause before each (seconds): together they span about 10 s, longer than most busy stretches.
CONFIRMATIONS = 4
CONFIRMATION_PAUSE_S = 1.0
#: Measurements per case when the baseline is rewritten; the smallest is stored (the least
#: contended one, as :func:`confirmed_ratio` judges the smallest).
BASELINE_MEASUREMENTS = 3


def confirmed_ratio(first: float, remeasure: Callable[[], float], limit: float,
                    confirmations: int = CONFIRMATIONS, pause_s: float = CONFIRMATION_PAUSE_S) -> tuple[float, list[float]]:
    """(the smallest ratio, every ratio measured): ``first``, and while every ratio so far is above
    ``limit`` (threshold × baseline), up to ``confirmations`` more from ``remeasure()``, each after
    a pause of ``pause_s`` seconds."""
    ratios = [first]
    while min(ratios) > limit and len(ratios) <= confirmations:
        time.sleep(pause_s)
        ratios.append(remeasure())
    return min(ratios), ratios


def paired_ratio(case_times: list[float], calibration_times: list[float]) -> float:
    """The median over rounds of case time / calibration time, the two timed in the same round.

    Raises:
        ValueError: the lists differ in length, are empty, or hold a time that is not > 0.
    """
    if len(case_times) != len(calibration_times) or not case_times:
        raise ValueError(f"case_times, calibration_times: got {len(case_times)} and {len(calibration_times)} "
                         "times; expected as many of each, at least one")
    if not all(t > 0 for t in (*case_times, *calibration_times)):
        raise ValueError("case_times, calibration_times: expected every time > 0 seconds")
    return statistics.median(c / k for c, k in zip(case_times, calibration_times))


def cpu_seconds(fn: Callable[[], object]) -> float:
    """CPU time of the calling thread spent in one call of ``fn`` (seconds): its wall time less
    the time it waited for a core. Counts torch's work only with one torch thread (intra-op work
    then runs inline on this thread), as the benchmarks set. A case's ``fn.prepare()``, where it has
    one (:class:`BackwardAlone`), runs first, untimed."""
    prepare = getattr(fn, "prepare", None)
    if prepare is not None:
        prepare()
    start = time.thread_time()
    fn()
    return time.thread_time() - start


class BackwardAlone:
    """A timed call of a backward alone: ``prepare()`` runs the forward, untimed (:func:`cpu_seconds`
    calls it before each timed call; pytest-benchmark's untimed ``setup`` too), and the call runs the
    backward of its output (a gradient of ones); called without ``prepare``, the call runs it first.

    Why cases of their own for one direction: in a case that times forward and backward together, a
    kernel twice as slow in one direction only is diluted below the gate's 1.5 (a 2x slower softmax
    forward made softmax_parallel_fwd_bwd_T1024 1.29x slower, the delta rule's write-then-read
    backward retrieval_setting2_train_step 1.17x; the gate passed both; alone, each direction of the three
    kernels planted twice as slow read 1.79-2.09x its baseline).

    Args:
        forward: builds the graph (grad enabled) and returns the output whose backward is timed.
        leaves: the tensors whose ``.grad`` is reset before each forward (none accumulates).
    """

    def __init__(self, forward: Callable[[], torch.Tensor], leaves: list[torch.Tensor]):
        self._forward, self._leaves = forward, leaves
        self._output: torch.Tensor | None = None

    def prepare(self) -> None:
        """Run the forward for the next call, unless it has run already (idempotent until the call)."""
        if self._output is not None:
            return
        for x in self._leaves:
            x.grad = None
        self._output = self._forward()
        self._grad = torch.ones_like(self._output)

    def __call__(self) -> None:
        if self._output is None:
            self.prepare()
        output, self._output = self._output, None
        output.backward(self._grad)


#: What an attention or kernel case times: the forward without autograd ("forward"), the forward
#: that builds the training graph, dropped ("train_forward"), forward and backward ("fwd_bwd"),
#: or the backward alone ("backward", :class:`BackwardAlone`).
CASE_PARTS = ("forward", "train_forward", "fwd_bwd", "backward")


def _timed_part(part: str, forward: Callable[[], torch.Tensor], leaves: list[torch.Tensor]) -> Callable[[], object]:
    """The call a case times of ``forward`` (run with grad enabled; ``leaves`` require grad unless
    ``part`` is "forward"), see :data:`CASE_PARTS`."""
    if part not in CASE_PARTS:
        raise ValueError(f"part: got {part!r}; expected one of {', '.join(CASE_PARTS)}")
    for x in leaves:
        x.requires_grad_(part != "forward")
    if part == "backward":
        return BackwardAlone(forward, leaves)

    def forward_only():
        with torch.no_grad():
            return forward()

    def train_forward():
        forward()  # the graph it builds is let go: what the training forward costs

    def forward_backward():
        for x in leaves:
            x.grad = None
        forward().sum().backward()

    return {"forward": forward_only, "train_forward": train_forward, "fwd_bwd": forward_backward}[part]


def _attention_call(spec: str, form: str, T: int, part: str, B: int = 2, H: int = 8, d: int = 64):
    """One call of an attention layer's ``form`` on fixed q, k, v (B, H, T, d) and β (B, H, T); what
    of it is timed: ``part`` (:data:`CASE_PARTS`)."""
    from fwbench.variants import build_attention

    torch.manual_seed(T)  # FAVOR+'s random features: the same case in every session
    attention = build_attention(spec, d_key=d).eval()
    generator = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(B, H, T, d, generator=generator) for _ in range(3))
    beta = torch.sigmoid(torch.randn(B, H, T, generator=generator)) if attention.uses_beta else None
    return _timed_part(part, lambda: attention(q, k, v, beta=beta, form=form)[0],
                       [x for x in (q, k, v, beta) if x is not None])


#: The kernels a kernel case can call (:func:`_kernel_call`).
KERNEL_RULES = ("delta", "sum", "fwm", "delta_write_read")


def _kernel_call(rule: str, T: int, B: int = 2, H: int = 8, d_dot: int = 128, d_v: int = 64, part: str = "forward"):
    """One call of a fast-weight rule's kernel alone, on fixed inputs: sum-normalised q, k
    (B, H, T, d_dot), as DPFP ν=1 gives them at d_key 64, v (B, H, T, d_v) and β (B, H, T) for the
    delta and FWM rules; ``rule`` one of :data:`KERNEL_RULES` ("delta_write_read": the delta rule's
    read of one query per sequence after the write, as the retrieval tasks read, q (B, H, 1, d_dot)),
    what of it is timed ``part`` (:data:`CASE_PARTS`). In an attention case the feature map and the
    padding share the time, so a kernel twice as slow makes the case only 1.5-1.8× slower; here it
    makes this case 2× slower.

    The kernel is looked up in its module at each call, so that ``--plant-slowdown`` reaches it."""
    from fwbench.variants.kernels import delta_rule, fwm_rule, sum_rule

    if rule not in KERNEL_RULES:
        raise ValueError(f"rule: got {rule!r}; expected one of {', '.join(KERNEL_RULES)}")
    generator = torch.Generator().manual_seed(T)
    q, k = (x / x.sum(-1, keepdim=True) for x in (torch.rand(B, H, T, d_dot, generator=generator) for _ in range(2)))
    q = q[:, :, -1:].contiguous() if rule == "delta_write_read" else q
    v = torch.randn(B, H, T, d_v, generator=generator)
    beta = torch.rand(B, H, T, generator=generator)
    calls = {
        "delta": lambda: delta_rule.delta_rule_chunk(q, k, v, beta)[0],
        "sum": lambda: sum_rule.sum_rule_chunk(q, k, v)[0],
        "fwm": lambda: fwm_rule.fwm_rule_recurrent(q, k, v, beta)[0],
        "delta_write_read": lambda: delta_rule.delta_rule_write_read(q, k, v, beta),
    }
    return _timed_part(part, calls[rule], [q, k, v] + ([] if rule == "sum" else [beta]))


def retrieval_step(variant: str = "dpfp-delta:nu=1", setting: int = 2, S: int = 60,
                   device: torch.device | None = None) -> Callable[[], None]:
    """One training step (loss, backward, Adam) of a retrieval task, batch 32, on one fixed batch;
    by default the Setting 2 shape, dpfp-delta ν=1, S=60. The model is built from seed 0."""
    from fwbench.tasks.retrieval import RetrievalConfig, RetrievalTask

    task = RetrievalTask()
    config = RetrievalConfig(setting=setting, S=S, batch_size=32)
    torch.manual_seed(0)
    model = task.build_model(config, variant).to(device or torch.device("cpu"))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    batch = {name: x.to(device or torch.device("cpu")) for name, x in
             task.train_batch(config, torch.Generator().manual_seed(0)).items()}

    def step():
        loss = task.loss(model, batch, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


@dataclass(frozen=True)
class PerfCase:
    """One tracked benchmark: a name (what it times), a builder of the timed call, CI membership."""

    name: str
    build: Callable[[], Callable[[], object]]
    short: bool = False


PERF_CASES: list[PerfCase] = [
    PerfCase("dpfp_delta_chunk_forward_T1024", lambda: _attention_call("dpfp-delta", "chunk", 1024, "forward"), short=True),
    PerfCase("dpfp_delta_chunk_fwd_bwd_T1024", lambda: _attention_call("dpfp-delta", "chunk", 1024, "fwd_bwd")),
    PerfCase("dpfp_chunk_forward_T1024", lambda: _attention_call("dpfp", "chunk", 1024, "forward"), short=True),
    PerfCase("dpfp_chunk_fwd_bwd_T1024", lambda: _attention_call("dpfp", "chunk", 1024, "fwd_bwd")),
    PerfCase("linear_chunk_fwd_bwd_T1024", lambda: _attention_call("linear", "chunk", 1024, "fwd_bwd")),
    PerfCase("favor_delta_chunk_forward_T1024", lambda: _attention_call("favor-delta", "chunk", 1024, "forward")),
    PerfCase("softmax_parallel_fwd_bwd_T1024", lambda: _attention_call("softmax", "parallel", 1024, "fwd_bwd")),
    # each direction of a kernel with a hand-written autograd Function alone (BackwardAlone says why)
    PerfCase("softmax_parallel_train_forward_T1024", lambda: _attention_call("softmax", "parallel", 1024, "train_forward")),
    PerfCase("softmax_parallel_backward_T1024", lambda: _attention_call("softmax", "parallel", 1024, "backward")),
    PerfCase("dpfp_delta_recurrent_forward_T256", lambda: _attention_call("dpfp-delta", "recurrent", 256, "forward")),
    PerfCase("retrieval_setting2_train_step", retrieval_step, short=True),
    PerfCase("fwm_setting2_train_step_S60", lambda: retrieval_step("dpfp-fwm:nu=1", 2, 60)),
    # Setting 1 at S = 600 (issue 16.4): the read of one query per sequence from the key tables
    PerfCase("setting1_train_step_S600_dpfp", lambda: retrieval_step("dpfp:nu=1", 1, 600)),
    PerfCase("setting1_train_step_S600_softmax", lambda: retrieval_step("softmax", 1, 600)),
    PerfCase("delta_rule_chunk_kernel_T1024", lambda: _kernel_call("delta", 1024)),
    PerfCase("sum_rule_chunk_kernel_T1024", lambda: _kernel_call("sum", 1024)),
    PerfCase("fwm_rule_kernel_train_forward_T256", lambda: _kernel_call("fwm", 256, part="train_forward")),
    PerfCase("fwm_rule_kernel_backward_T256", lambda: _kernel_call("fwm", 256, part="backward")),
    PerfCase("delta_write_read_train_forward_T1024", lambda: _kernel_call("delta_write_read", 1024, B=16, part="train_forward")),
    PerfCase("delta_write_read_backward_T1024", lambda: _kernel_call("delta_write_read", 1024, B=16, part="backward")),
]


def measure_ratio(case: PerfCase, rounds: int = PAIRED_RATIO_ROUNDS) -> tuple[float, float, float]:
    """(ratio, case CPU seconds, calibration CPU seconds): :func:`paired_ratio` over ``rounds``
    rounds that time the calibration and the case in turns (after one warm-up call of each), in
    :func:`cpu_seconds`, and the two medians."""
    fn, calibration = case.build(), calibration_workload()
    cpu_seconds(fn), calibration()
    case_times, calibration_times = [], []
    for round_index in range(rounds):
        order = (calibration, fn) if round_index % 2 == 0 else (fn, calibration)
        times = {id(f): cpu_seconds(f) for f in order}
        case_times.append(times[id(fn)])
        calibration_times.append(times[id(calibration)])
    return (paired_ratio(case_times, calibration_times), statistics.median(case_times),
            statistics.median(calibration_times))


@dataclass(frozen=True)
class Regression:
    """A benchmark slower than its baseline beyond the threshold."""

    name: str
    measured_ratio: float
    baseline_ratio: float
    threshold: float

    @property
    def slowdown(self) -> float:
        return self.measured_ratio / self.baseline_ratio

    def message(self) -> str:
        return (f"{self.name}: time / calibration = {self.measured_ratio:.3f} now vs {self.baseline_ratio:.3f} in the "
                f"baseline ({self.slowdown:.2f}× slower; threshold {self.threshold:.2f}×)")


def compare(measured: dict[str, float], baseline: dict[str, float], threshold: float) -> list[Regression]:
    """Regressions among ``measured`` ratios: those above ``threshold`` × their baseline ratio.

    Benchmarks missing from the baseline are not judged (a new benchmark has nothing to regress
    from); ``threshold`` must be > 1.

    Raises:
        ValueError: a threshold ≤ 1 or a non-positive baseline ratio.
    """
    if not threshold > 1:
        raise ValueError(f"threshold: got {threshold!r}; expected a factor > 1")
    regressions = []
    for name, ratio in measured.items():
        if name not in baseline:
            continue
        if not baseline[name] > 0:
            raise ValueError(f"baseline ratio of {name}: got {baseline[name]!r}; expected > 0")
        if ratio > threshold * baseline[name]:
            regressions.append(Regression(name, ratio, baseline[name], threshold))
    return regressions


#: What a baseline file holds, as :func:`read_baseline` checks it (said in its errors).
BASELINE_FORMAT = ('a JSON object {"benchmarks": {CASE: {"ratio": a finite number > 0, ...}, ...}, '
                   '"environment": {"device_name": CPU, ...}, ...}, as `nox -s bench -- --update-baseline` writes it')


def read_baseline(path: Path) -> dict:
    """The contents of the baseline file ``path`` (which must exist), checked: a JSON object whose
    ``benchmarks`` maps each case name to an object with a ``ratio`` (a finite number > 0), and whose
    ``environment``, where present and not null, is an object with a string (or null) ``device_name``
    and ``cpu_identity``.

    An empty file, git conflict markers, a JSON list, a ratio that is null, NaN, negative or a string
    crashed the gate (a pytest INTERNALERROR or a KeyError traceback) or, without a CPU name it could
    read, made the file look like another CPU's; so did a ratio written as an integer too large for a
    float (OverflowError), one of over 4300 digits or arrays nested thousands deep (RecursionError).

    Raises:
        ValueError: one line naming the file, what is wrong and :data:`BASELINE_FORMAT`.
    """
    path = Path(path)

    def bad(what: str) -> ValueError:
        return ValueError(f"baseline {path}: {what}; expected {BASELINE_FORMAT} (fix the file or delete it)")

    kind = special_file(path)
    if kind is not None:  # reading a named pipe blocks until something writes to it: the gate hung, with no word
        raise bad(f"got {kind}, not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bad(f"cannot be read ({type(exc).__name__}: {exc})") from None
    if not text.strip():
        raise bad("the file is empty")
    if re.search(r"^(<{7}|={7}|>{7})( |$)", text, re.MULTILINE):
        raise bad("it holds git conflict markers (<<<<<<<, =======, >>>>>>>)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4300 digits; arrays nested past the recursion limit
        raise bad(f"not JSON that Python reads ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(data, dict):
        raise bad(f"got a JSON {type(data).__name__}")
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, dict):
        raise bad("no \"benchmarks\" object" if benchmarks is None else
                  f"\"benchmarks\" is a {type(benchmarks).__name__}")
    for name, entry in benchmarks.items():
        ratio = entry.get("ratio") if isinstance(entry, dict) else None
        shown = name if name.isprintable() else repr(name)  # a case name holding a newline split the line
        if not isinstance(entry, dict):
            raise bad(f"benchmarks.{shown}: got {entry!r}")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not _finite_positive(ratio):
            raise bad(f"benchmarks.{shown}.ratio: got {ratio!r}")
    environment = data.get("environment")
    if environment is not None and not isinstance(environment, dict):
        raise bad(f"\"environment\": got {environment!r}")
    for key in ("device_name", "cpu_identity"):
        name = (environment or {}).get(key)
        if name is not None and not isinstance(name, str):
            raise bad(f"environment.{key}: got {name!r}")
    return data


def _finite_positive(number: int | float) -> bool:
    """Whether ``number`` is a finite float > 0: an integer too large for a float (a ratio of 10**400,
    which JSON holds as an integer) raised OverflowError from math.isfinite, past read_baseline's check."""
    try:
        return math.isfinite(float(number)) and number > 0
    except OverflowError:
        return False


def baseline_cpu(path: Path) -> str | None:
    """The CPU a baseline file was measured on: its ``environment.cpu_identity``
    (:func:`~fwbench.run.environment.cpu_identity`), or in a file written before it was recorded, the
    model name ``environment.device_name``; None when the file does not exist or says neither.

    Raises:
        ValueError: the file exists but is not a baseline (:func:`read_baseline`).
    """
    path = Path(path)
    if not path.exists():
        return None
    environment = read_baseline(path).get("environment") or {}
    return environment.get("cpu_identity") or environment.get("device_name")


#: The longest CPU part of a baseline file name, in UTF-8 bytes: a file name is at most 255 bytes on
#: most file systems, and a longer CPU name is cut and given a hash, which keeps distinct names apart.
MAX_SLUG_BYTES = 64


def _cpu_hash(cpu: str) -> str:
    return hashlib.sha256(cpu.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _slug(cpu: str, fallback: str = "unknown-cpu") -> str:
    """``cpu`` as the CPU part of a baseline file name: lower case, each run of other characters than
    letters and digits one "-" ("AMD EPYC [family 25, model 17, AVX512]" → "amd-epyc-family-25-model-17-avx512")."""
    slug = "".join(c if c.isalnum() else "-" for c in cpu.lower())
    return "-".join(part for part in slug.split("-") if part) or fallback


def _cut_slug(slug: str) -> str:
    """``slug`` cut to :data:`MAX_SLUG_BYTES` UTF-8 bytes (whole characters, no trailing "-")."""
    return slug.encode("utf-8", "surrogatepass")[:MAX_SLUG_BYTES].decode("utf-8", "ignore").rstrip("-")


_MOVE_THE_FILE, _MEND_THE_LINK = "move the file away", "create the link's target or remove the link"
_BREAK_THE_LOOP = "remove the link or point it at a directory"


def _loops(path: Path) -> bool:
    """Whether following the links of ``path`` never ends (``ln -s b a; ln -s a b``: ELOOP)."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _directory_fault(directory: Path) -> tuple[str, str] | None:
    """(why, what to do) where ``directory`` can be neither read as the baselines directory nor created by
    ``--update-baseline`` (its ``mkdir(parents=True, exist_ok=True)``): a file; a link to nothing or one that loops (no
    directory, and none can be made there); a path under a file or under a link to nothing (one of its
    parents). None where it is a directory or can be made one. Each of these was called missing ("nothing is
    judged", advising ``--update-baseline``, which measured every case before failing to write)."""
    if directory.exists():
        return None if directory.is_dir() else _file_fault(directory, "")
    for path in (directory, *directory.parents):
        if path.is_symlink() and not path.exists():
            where = "a link" if path == directory else f"a path under {path}, a link"
            if _loops(path):
                # its target exists (a link leading back): "which does not exist" and "create the link's
                # target" were false, and mkdir on that target fails as the link did
                hops, entry = loop_entry(path)
                if entry is None:
                    return f"{where} to {str(path.readlink())!r}, which leads back to it (a loop)", _BREAK_THE_LOOP
                # a link into another's loop (ln -s loop/sub baselines; ln -s loop loop) was said to lead back to itself
                named = ", a link to ".join(repr(hop) for hop in hops)
                return (f"{where} to {named}, which leads into {str(entry)!r}, a link that leads back to itself "
                        "(a loop)"), _BREAK_THE_LOOP
            # a link to a link to nothing was 'a link to 'b', which does not exist': b exists, and 'create the
            # link's target' there failed (mkdir b: it is a link); each link is named, to the missing end
            # the path to create is named as reached from anywhere: 'create 'gone'' for results/b -> gone, run
            # in the repository's root, made ./gone, and the links still led to nothing
            chain, end = link_chain(path)
            named = ", a link to ".join(repr(hop) for hop in chain)
            blocked = blocking_file(end)
            if blocked is not None:
                # 'create the link's target' (notes.txt/sub), followed, failed: no directory can be made under a file
                return f"{where} to {named}, which does not exist and cannot be made ({str(blocked)!r} is a file)", \
                    _BREAK_THE_LOOP
            # "create the link's target" for one link, unless the target lies under a link to nothing: mkdir -p of
            # 'd/sub', d a link to nothing, says 'File exists', so the path that can be made is named
            plain = len(chain) == 1 and end == os.path.normpath(Path(os.path.realpath(path.parent)) / chain[0])
            return (f"{where} to {named}, which does not exist",
                    _MEND_THE_LINK if plain else f"create {end!r} or remove the link{'' if len(chain) == 1 else 's'}")
        if path.exists():
            return None if path.is_dir() else _file_fault(path, f"a path under {path}, ")
    return None


def _file_fault(path: Path, where: str) -> tuple[str, str]:
    """(why, what to do) for ``path``, a file where a directory is wanted (``where`` says how it is reached): a link to
    a file is named as one, and advised to be removed: "move the file away", followed, left a link to nothing,
    refused next (C203). A chain of links is named link by link."""
    if path.is_symlink():
        # each link is named to the file: a link to a link to a file said "a link to 'mid', a file", mid being a link
        named = ", a link to ".join(repr(hop) for hop in link_chain(path)[0])
        return f"{where}a link to {named}, a file, not a directory", _BREAK_THE_LOOP
    return (f"{where}a file" if where else "a file, not a directory"), _MOVE_THE_FILE


def _broken_link_fault(path: Path) -> ValueError | None:
    """The refusal of a baseline file ``path`` that is a link through which no file can be read or written: one that
    loops, or leads to nothing in a directory that does not exist or lies under a file. None where ``path`` is no
    such link (a link to nothing in a directory that exists is written through: ``--update-baseline`` makes its
    target). Such a file was taken as free: judged, "there is no perf_baseline.json, so nothing is judged";
    ``--update-baseline`` measured every case, then failed to write (an OSError traceback)."""
    if not path.is_symlink() or path.exists():
        return None
    if _loops(path):
        why, remedy = describe_loop(path), "remove the link or point it at a baseline file"
    else:
        hops, end = link_chain(path)
        named = ", a link to ".join(repr(hop) for hop in hops)
        blocked = blocking_file(end)
        parent = Path(end).parent
        if blocked is not None:
            why = f"a link to {named}, which does not exist and cannot be made ({str(blocked)!r} is a file)"
            remedy = "remove the link or point it elsewhere"
        elif not parent.is_dir():
            why = f"a link to {named}, which does not exist, in a directory that does not exist ({str(parent)!r})"
            remedy = f"create {str(parent)!r} or remove the link"
        else:
            return None
    return ValueError(f"baseline {path}: got {why}; expected a baseline file, or a link to one that can be made "
                      f"({remedy})")


def baseline_path_for(cpu: str, directory: Path = BASELINE_DIR) -> Path:
    """The baseline file of CPU ``cpu`` (:func:`~fwbench.run.environment.cpu_identity`; may not exist
    yet): a file that either does not exist or says it was measured on ``cpu``, never another CPU's
    (nor one that does not say whose).

    The candidates, in order: ``perf_baseline.json``, ``perf_baseline-<cpu, as a file name>.json``
    and that name with 8 hex digits of a hash of ``cpu`` (for two models whose names give one file
    name, "AMD EPYC" and "AMD-EPYC", so that neither is judged against, nor overwrites, the
    other's). The first candidate that exists and says it was measured on ``cpu``; where none does,
    the first that does not exist. The CPU part of the name is cut to :data:`MAX_SLUG_BYTES` bytes
    (a name of hundreds of characters raised "File name too long"), and then always carries the hash.

    Raises:
        ValueError: no candidate is a baseline file measured on ``cpu`` and one is not a baseline
        (:func:`read_baseline`: it may be this CPU's), or every candidate is another CPU's. A candidate
        that is not a baseline beside one measured on ``cpu`` is no error: a corrupt ``perf_baseline.json``
        (an Intel Xeon's) stopped the gate, and ``--update-baseline``, on a CPU with a good file of its own.
        Also ``directory`` that is no directory and cannot be made one (:func:`_directory_fault`: a file, a
        link to nothing, a path under a file).
    """
    directory = Path(directory)
    fault = _directory_fault(directory)
    if fault:
        # no file can be read or written in it: judged, it was called missing ("nothing is judged", advising
        # --update-baseline), and --update-baseline measured every case, then failed on FileExistsError
        # (NotADirectoryError under a file)
        raise ValueError(f"baseline directory {directory}: got {fault[0]}; expected the directory of the baseline "
                         f"files (perf_baseline*.json), or no such path ({fault[1]})")
    slug = _slug(cpu)
    candidates = [directory / BASELINE_PATH.name]
    if len(slug.encode("utf-8", "surrogatepass")) > MAX_SLUG_BYTES:
        candidates.append(directory / f"perf_baseline-{_cut_slug(slug)}-{_cpu_hash(cpu)}.json")
    else:
        candidates += [directory / f"perf_baseline-{slug}.json", directory / f"perf_baseline-{slug}-{_cpu_hash(cpu)}.json"]
    unreadable = []
    for path in candidates:
        broken = _broken_link_fault(path)
        if broken is not None:
            unreadable.append(broken)
            continue
        try:
            if path.exists() and baseline_cpu(path) == cpu:
                return path
        except ValueError as exc:  # judged below: it may be this CPU's, or another's (perf_baseline.json)
            unreadable.append(exc)
    if unreadable:
        # no readable candidate is this CPU's, and an unreadable one may be: neither judged against
        # another's file nor written beside its own
        raise unreadable[0]
    for path in candidates:
        if not path.exists():
            return path
    raise ValueError(f"baseline of CPU {cpu!r}: every candidate file ({', '.join(p.name for p in candidates)}) is "
                     f"another CPU's or names none; expected one of them measured on {cpu!r} or free")


def choose_baseline(cpu: str, directory: Path = BASELINE_DIR, model: str | None = None) -> tuple[Path, str | None]:
    """(the baseline file to judge this CPU against, a warning or None).

    The file measured on ``cpu`` (the gate passes :func:`~fwbench.run.environment.cpu_identity`)
    where there is one; else a file measured on a CPU of the same model name ``model``
    (:func:`~fwbench.run.environment.cpu_model`; another generation, or a file that does not record
    which), else ``perf_baseline.json``, each with a warning that its ratios come from another machine
    (or one it does not name), so that a slowdown smaller than the machines' difference can pass
    unnoticed (or an unchanged case fail). A case this CPU's file lacks: :func:`judged_baseline`.

    A file that is not a baseline and is not one of this CPU's own names (:func:`baseline_path_for`) is
    left out of the search for a same-model file (:func:`_same_model_baseline`), said at the end of the warning.

    Raises:
        ValueError: one of this CPU's own candidate files (:func:`baseline_path_for`) is not a baseline
        (:func:`read_baseline`).
    """
    own = baseline_path_for(cpu, directory)
    if own.exists():
        return own, None
    same_model, skipped = _same_model_baseline(model, directory) if model and model != cpu else (None, [])
    # a corrupt file of another CPU (an AMD EPYC's, on an Intel Xeon) stopped this CPU's gate; it is left
    # out, said at the end of the warning, where it cannot be missed if it was the same-model file wanted
    not_read = "".join(f"; {name} is left out of the search for a file of model {model!r}: {exc}"
                       for name, exc in skipped)
    if same_model is not None:
        path, identity = same_model
        origin = repr(identity) if identity else f"a CPU named {model!r} that records no family, model or instruction set"
        return path, (f"no performance baseline was measured on this CPU ({cpu!r}): judging against {path.name}, "
                      f"measured on {origin}; one model name covers CPU generations whose ratios differ (1.05-1.48x "
                      f"between two 'AMD EPYC's on the same code), so an unchanged case can fail and a slowdown "
                      f"smaller than that can pass. On a quiet machine, `nox -s bench -- --update-baseline` writes "
                      f"{own.name} for this CPU{not_read}")
    default = Path(directory) / BASELINE_PATH.name
    if not default.exists():
        missing = "" if Path(directory).is_dir() else " (no such directory)"
        return default, (f"no performance baseline in {directory}{missing}: none was measured on this CPU ({cpu!r}) "
                         f"and there is no {default.name}, so nothing is judged. On a quiet machine, "
                         f"`nox -s bench -- --update-baseline` writes {own.name} for this CPU{not_read}")
    measured_on = baseline_cpu(default)
    origin = repr(measured_on) if measured_on else "a CPU it does not name (no environment.device_name)"
    return default, (f"no performance baseline was measured on this CPU ({cpu!r}): judging against {default.name}, "
                     f"measured on {origin}; ratios differ between machines (0.31-0.99x on an AMD "
                     f"EPYC against an Intel Xeon), so a slowdown smaller than that can pass. On a quiet machine, "
                     f"`nox -s bench -- --update-baseline` writes {own.name} for this CPU{not_read}")


def _same_model_baseline(model: str, directory: Path) -> tuple[tuple[Path, str | None] | None, list[tuple[str, ValueError]]]:
    """((a baseline file whose ``environment.device_name`` is ``model``, its ``cpu_identity`` or None), or None
    where there is none; (file name, why) of each file left out). A file that does not record its CPU's identity
    (it may be this CPU's generation) before one that records another, then by file name.

    A file that is not a baseline is left out, with its reason: the caller (:func:`choose_baseline`) has
    already stopped on any of this CPU's own names (:func:`baseline_path_for`), and a same-model file is a
    stand-in whose ratios come from another machine. Guessing from a file name whether a corrupt file was a
    CPU of ``model``'s stopped the gate on names that were another model's ("AMD EPYC" on
    "...-amd-epyc-7b13.json", "(Broadwell)" on "...-broadwell-no-tsx-..."), and no rule over names tells all
    of them apart ("AMD EPYC Default" against an "AMD EPYC" with torch capability DEFAULT).
    """
    found, skipped = [], []
    for path in sorted(Path(directory).glob("perf_baseline*.json")):
        try:
            environment = read_baseline(path).get("environment") or {}
        except ValueError as exc:
            skipped.append((path.name, exc))
            continue
        if environment.get("device_name") == model:
            found.append((environment.get("cpu_identity") is not None, path.name, path, environment.get("cpu_identity")))
    return (min(found)[2:] if found else None), skipped


def load_baseline(path: Path = BASELINE_PATH) -> dict[str, float]:
    """Benchmark name → baseline ratio; empty when the file does not exist.

    Raises:
        ValueError: the file exists but is not a baseline (:func:`read_baseline`).
    """
    if not Path(path).exists():
        return {}
    return {name: float(entry["ratio"]) for name, entry in read_baseline(path)["benchmarks"].items()}


@dataclass(frozen=True)
class JudgedBaseline:
    """What a CPU's cases are judged against (:func:`judged_baseline`)."""

    #: case name → baseline ratio
    ratios: dict[str, float]
    #: the files the ratios were read from, this CPU's (or the one chosen for it) first; none where
    #: there is no baseline file to judge against (nothing is judged)
    files: tuple[Path, ...]
    #: what the terminal says before and after the verdicts: ratios from another machine, or none at all
    warnings: tuple[str, ...]

    def where(self) -> str:
        """The files, for a message: "perf_baseline-amd-epyc.json or perf_baseline.json"; "no baseline file"
        where there is none."""
        return " or ".join(path.name for path in self.files) or "no baseline file"


def judged_baseline(cpu: str, directory: Path = BASELINE_DIR, torch_version: str | None = None,
                    model: str | None = None) -> JudgedBaseline:
    """The ratios the gate judges CPU ``cpu`` (of model name ``model``) against: those of the file
    :func:`choose_baseline` picks, with its warning; where that is this CPU's own file and it lacks cases that
    ``perf_baseline.json`` has (a partial ``--update-baseline -k ...``), those cases take
    ``perf_baseline.json``'s ratio, with a warning naming them and the CPU that file was measured
    on. They were not judged at all before, with no word, while the other cases were. A file measured
    under another torch than ``torch_version`` (default: the one installed) gets a warning too: every
    ratio moves with torch's kernels, the calibration matmul's included, and the gate never said so.

    ``perf_baseline.json`` not a baseline file, beside this CPU's own, is no error: a warning says the
    cases this CPU's file lacks are judged against nothing. Where no file can judge this CPU (the directory is
    empty or missing, or holds other models' files only), nothing is judged: no ratios, no files, and
    :func:`choose_baseline`'s one warning, which says how to write a baseline.

    Raises:
        ValueError: a baseline file it judges against (or one that may be this CPU's) is not a baseline
        (:func:`read_baseline`).
    """
    path, warning = choose_baseline(cpu, directory, model)
    if not path.exists():
        # no baseline at all (an empty or missing directory, or only other models' files): the torch
        # version of the missing file was read, and the gate stopped on "cannot be read (FileNotFoundError)"
        return JudgedBaseline({}, (), (warning,))
    ratios, files, warnings = load_baseline(path), [path], [warning] if warning else []
    default = Path(directory) / BASELINE_PATH.name
    if path != default and default.exists():
        try:
            fallback = {name: ratio for name, ratio in load_baseline(default).items() if name not in ratios}
        except ValueError as exc:
            # another CPU's file, needed only for cases this CPU's file lacks: a corrupt one (a merge
            # conflict in the Intel Xeon's file) stopped every CPU's gate; those cases go unjudged, said
            fallback = {}
            warnings.append(f"{default.name} is not read ({exc}): a case {path.name} has no ratio for is judged "
                            f"against nothing (skipped)")
        if fallback:
            measured_on = baseline_cpu(default)
            origin = repr(measured_on) if measured_on else "a CPU it does not name"
            ratios |= fallback
            files.append(default)
            warnings.append(f"{path.name} has no ratio for {len(fallback)} case(s) ({', '.join(sorted(fallback))}): "
                            f"judging them against {default.name}, measured on {origin}; ratios differ between "
                            f"machines, so a slowdown smaller than that can pass. On a quiet machine, "
                            f"`nox -s bench -- --update-baseline -k NAME` adds a case to {path.name}")
    torch_version = torch.__version__ if torch_version is None else torch_version
    for file in files:
        measured_with = (read_baseline(file).get("environment") or {}).get("torch")
        if measured_with and measured_with != torch_version:
            warnings.append(f"{file.name} was measured with torch {measured_with}, this is torch {torch_version}: "
                            f"ratios move with torch's kernels, so a pass or a fail may be torch's; on a quiet "
                            f"machine, `nox -s bench -- --update-baseline` measures it again")
    return JudgedBaseline(ratios, tuple(files), tuple(warnings))


def write_baseline(ratios: dict[str, float], seconds: dict[str, float], environment: dict,
                   path: Path = BASELINE_PATH) -> Path:
    """Write (or update) the baseline with these ratios, keeping benchmarks not measured now.

    Raises:
        ValueError: ``path`` exists but is not a baseline (:func:`read_baseline`).
    """
    path = Path(path)
    data = read_baseline(path) if path.exists() else {"benchmarks": {}}
    data["calibration"] = f"fp32 ({CALIBRATION_N} x {CALIBRATION_N}) @ ({CALIBRATION_N} x {CALIBRATION_N}) matmul, CPU"
    data["thresholds"] = {"full": FULL_THRESHOLD, "gross": GROSS_THRESHOLD}
    data["environment"] = environment
    for name, ratio in ratios.items():
        data["benchmarks"][name] = {"ratio": ratio, "seconds": seconds.get(name)}
    data["benchmarks"] = dict(sorted(data["benchmarks"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(strict_dumps(data, indent=2, sort_keys=True) + "\n")
    return path
