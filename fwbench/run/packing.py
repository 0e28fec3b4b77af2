"""Many retrieval runs in one process: runs that share shapes train as one packed model.

Runs of a grid that differ only in their seed and their stopping rule (``target_loss``,
``patience``, ``max_steps``) have weights of identical shapes and identical optimiser settings:
they train together as a :class:`~fwbench.tasks.retrieval_pack.PackedRetrievalModel`, whose every
weight has a leading run axis. Each run keeps what :func:`fwbench.run.training.fit` gives it alone:

- its initial weights (``torch.manual_seed(seed)``, then the task's model), its own training and
  evaluation generators, seeded as ``fit`` seeds them, and drawn in the same order;
- its own loss: the pack minimises the *sum* of the runs' mean losses, so each run's gradient is
  its solo gradient, and one fused Adam over the stacked weights is R independent Adams
  (elementwise, one shared step count, as every run in the pack has taken the same steps);
- its own early stopping and divergence: a run that stops (converged, plateau, budget, a
  non-finite loss or gradient) leaves the pack with its weights and Adam moments, and the others
  go on as before; a run whose gradient is not finite never gets that step;
- its own record, in the solo format plus ``"packed": {"runs": R}``, yielded as soon as the run
  ends, so the store keeps every finished run of a pack that is interrupted.

A packed run's curve equals its solo curve up to fp32 summation order (tests/run/test_packing.py).
Packing applies to the retrieval task on the local launcher with one process (``--jobs 1``), to
variants whose attention holds no per-run state (not FAVOR+), and to configs without checkpoints,
schedules or gradient clipping; every other run trains alone. By default runs pack where it pays
(:func:`~fwbench.run.pack_plan.packing_pays`: always on CUDA, small steps on CPU); ``--no-pack`` or
``FWBENCH_PACK=0`` switches it off, ``FWBENCH_PACK=N`` packs up to N runs wherever they can be
(:func:`~fwbench.run.pack_plan.pack_policy`; the grouping is :func:`~fwbench.run.pack_plan.plan_packs`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from fwbench.errors import FwbenchError
from fwbench.run.execute import build_record, utc_now
from fwbench.run.grid import RunSpec, check_task_config, import_modules_of
from fwbench.run.launchers import failed_record
from fwbench.run.optimization import build_optimizer
from fwbench.run.pack_plan import PER_RUN_KEYS
from fwbench.run.training import EVAL_SEED_OFFSET, FitResult, LoopState
from fwbench.tasks import TASKS
from fwbench.tasks.retrieval import RetrievalConfig, RetrievalModel, generate_sequences, last_occurrence_values, retrieval_loss
from fwbench.tasks.retrieval_pack import PackedRetrievalModel, packable_model
from fwbench.variants import NonFiniteError, set_check_finite
from fwbench.variants.kernels.precision import denormals_flushed


@dataclass(eq=False)
class _Member:
    """One run of a pack: its position in the caller's list, config, seed, streams and loop."""

    index: int
    config: RetrievalConfig
    seed: int
    train: torch.Generator
    eval: torch.Generator
    loop: LoopState = field(default_factory=LoopState)
    loss: float | None = None


def _shrink(model: PackedRetrievalModel, optimizer: torch.optim.Optimizer, keep: list[int],
            config) -> torch.optim.Optimizer:
    """Keep only the pack's runs at positions ``keep``: their weights, gradients and Adam moments
    (sliced along the run axis; the shared step count stays). Returns the optimiser of the new
    weights."""
    index = torch.tensor(keep, device=model.key_embedding.device)
    moved = {}
    for name, old in list(model.named_parameters()):
        new = nn.Parameter(old.detach().index_select(0, index))
        if old.grad is not None:
            new.grad = old.grad.index_select(0, index)
        state = optimizer.state.get(old, {})
        moved[new] = {k: v.index_select(0, index) if v.dim() else v for k, v in state.items()}
        setattr(model, name, new)
    optimizer = build_optimizer(model, config)
    for parameter, state in moved.items():
        if state:
            optimizer.state[parameter] = state
    return optimizer


def _finite_per_run(model: PackedRetrievalModel) -> Tensor:
    """(R,) bool: whether every gradient element of each run is finite."""
    finite = torch.ones(model.runs, dtype=torch.bool, device=model.key_embedding.device)
    for p in model.parameters():
        if p.grad is not None:
            finite &= torch.isfinite(p.grad.reshape(model.runs, -1)).all(dim=1)
    return finite


def _stack(batches: list[dict[str, Tensor]], device: torch.device) -> dict[str, Tensor]:
    return {key: torch.stack([b[key] for b in batches]).to(device) for key in batches[0]}


class _Pack:
    """The packed model, its optimiser and the runs still in it (in the model's run order)."""

    def __init__(self, variant: str, configs: list[RetrievalConfig], seeds: list[int], device: torch.device,
                 check_finite: bool):
        task = TASKS["retrieval"]
        models: list[RetrievalModel] = []
        for config, seed in zip(configs, seeds):
            torch.manual_seed(seed)  # each run's initial weights, as fit draws them
            models.append(task.build_model(config, variant))
        if not packable_model(models[0]):
            raise FwbenchError(f"pack: variant {variant} holds per-run attention state; it trains alone")
        self.model = PackedRetrievalModel(models).to(device)
        set_check_finite(self.model, check_finite)
        self.device, self.config = device, configs[0]
        self.optimizer = build_optimizer(self.model, self.config)
        self.parameters = self.model.parameters_per_run()
        self.members = [_Member(i, config, seed, torch.Generator().manual_seed(seed),
                                torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET))
                        for i, (config, seed) in enumerate(zip(configs, seeds))]

    def drop(self, leaving: list[_Member]) -> None:
        """Take ``leaving`` out of the pack."""
        if not leaving:
            return
        keep = [i for i, m in enumerate(self.members) if m not in leaving]
        self.members = [self.members[i] for i in keep]
        if keep:
            self.optimizer = _shrink(self.model, self.optimizer, keep, self.config)

    def _losses(self, batch: dict[str, Tensor], positions: list[int]) -> list[Tensor]:
        runs = None if len(positions) == len(self.members) else torch.tensor(positions, device=self.device)
        predicted = self.model(batch["keys"], batch["values"], batch["queries"], runs=runs)
        return [retrieval_loss(predicted[i], batch["targets"][i], self.config.S) for i in range(len(positions))]

    def _forward_each(self, batch: dict[str, Tensor]) -> tuple[list[Tensor | None], list[str | None]]:
        """The training losses with a NaN/inf check failing somewhere in the pack: each run on its
        own, so that only the runs whose tensors are not finite diverge, with the solo message."""
        losses, failures = [], []
        for position in range(len(self.members)):
            one = {key: value[position:position + 1] for key, value in batch.items()}
            try:
                losses.append(self._losses(one, [position])[0])
                failures.append(None)
            except NonFiniteError as exc:
                losses.append(None)
                failures.append(f"training: {exc}")
        return losses, failures

    def train_step(self, step: int) -> list[_Member]:
        """One optimiser step of every run in the pack; returns the runs that diverged (not yet dropped)."""
        started = time.perf_counter()
        self.model.train()
        batch = _stack([TASKS["retrieval"].train_batch(m.config, m.train) for m in self.members], self.device)
        failures: list[str | None] = [None] * len(self.members)
        try:
            losses: list[Tensor | None] = self._losses(batch, list(range(len(self.members))))
        except NonFiniteError:
            losses, failures = self._forward_each(batch)
        total = None
        for member, loss, failure in zip(self.members, losses, failures):
            member.loop.step = step
            member.loss = math.nan if loss is None else loss.item()
            if failure is None and math.isfinite(member.loss):
                total = loss if total is None else total + loss
        self.optimizer.zero_grad(set_to_none=True)
        if total is not None:
            total.backward()
        finite = _finite_per_run(self.model).tolist()
        diverged = []
        for member, failure, gradient_ok in zip(self.members, failures, finite):
            if failure is not None or not math.isfinite(member.loss):
                member.loop.diverge(failure or f"training loss is {member.loss}")
                diverged.append(member)
            elif not gradient_ok:
                member.loop.diverge("non-finite gradient (not applied)")
                diverged.append(member)
        self.drop(diverged)  # before the step: a diverged run never applies its gradient
        if self.members:
            self.optimizer.step()
        elapsed = time.perf_counter() - started
        for member in self.members:
            member.loop.train_s += elapsed
        return diverged

    @torch.no_grad()
    def evaluate(self, due: list[_Member], last: bool) -> list[_Member]:
        """Evaluate the runs ``due`` (each on its own fresh sequences) and record it; returns those
        that stop here."""
        if not due:
            return []
        self.model.eval()
        positions = [self.members.index(m) for m in due]
        config = self.config
        sequences = [generate_sequences(config.setting, config.S, config.eval_sequences, m.eval) for m in due]
        keys = torch.stack([s[0] for s in sequences]).to(self.device)
        values = torch.stack([s[1] for s in sequences]).to(self.device)
        queries = torch.arange(config.S, device=self.device).expand(len(due), config.eval_sequences, -1)
        try:
            predicted = self.model(keys, values, queries, runs=torch.tensor(positions, device=self.device))
        except NonFiniteError:
            predicted = None
        stopping = []
        for i, member in enumerate(due):
            try:
                # a NaN/inf somewhere in the pack: this run's own forward names its tensor, as alone
                run_prediction = predicted[i] if predicted is not None else self.model(
                    keys[i:i + 1], values[i:i + 1], queries[i:i + 1],
                    runs=torch.tensor([positions[i]], device=self.device))[0]
            except NonFiniteError as exc:
                member.loop.diverge(f"evaluation: {exc}")
                stopping.append(member)
                continue
            targets, present = last_occurrence_values(keys[i], values[i], queries[i])
            mask = present.float()
            correct = (run_prediction.argmax(-1) == targets).float()
            metrics = {"loss": retrieval_loss(run_prediction, targets, config.S, mask).item(),
                       "accuracy": ((correct * mask).sum() / mask.sum()).item()}
            if member.loop.record_evaluation(metrics, None if last else member.loss, member.config, last):
                stopping.append(member)
        return stopping

    def result(self, member: _Member) -> FitResult:
        loop = member.loop
        return FitResult(status=loop.status, steps=loop.step, best_eval=loop.best_eval, final_eval=loop.last_eval,
                         best_step=loop.best_step, curve=loop.curve, diverged_at=loop.diverged_at,
                         diverged_reason=loop.diverged_reason, wall_s=loop.elapsed(), train_s=loop.train_s,
                         parameters=self.parameters)


def fit_packed(variant: str, configs: list[RetrievalConfig], seeds: list[int], device: torch.device,
               on_progress: Callable[[int, float], None] | None = None,
               check_finite: bool = True) -> Iterator[tuple[int, FitResult]]:
    """Train the retrieval runs (``configs[i]``, ``seeds[i]``) of one variant as one pack.

    Yields ``(i, result)`` as each run ends, ``result`` being what
    ``fit("retrieval", variant, configs[i], seeds[i], device)`` returns up to fp32 summation order
    (the same curve, stopping step and status). The configs may differ only in
    :data:`PER_RUN_KEYS`. ``on_progress(step, loss)`` gets the first remaining run's loss.

    Raises:
        FwbenchError: the configs differ elsewhere, or the variant's attention holds per-run state.
    """
    # as fit() checks its config: lr = 1e-320 trained to max_steps, read as 0 (pass AW); trained as checked (pass AY)
    configs = [check_task_config("retrieval config", TASKS["retrieval"], config, run_id_types=False)
               for config in configs]
    # a NumPy scalar (np.float32 lr) raised json's TypeError here (break-it pass AX): compared as its Python number
    shared = {json.dumps({k: v for k, v in vars(c).items() if k not in PER_RUN_KEYS}, sort_keys=True,
                         default=lambda v: v.item() if hasattr(v, "item") else repr(v))
              for c in configs}
    if len(shared) != 1 or len(configs) != len(seeds):
        raise FwbenchError(f"pack: got configs differing outside {', '.join(PER_RUN_KEYS)}; expected one config "
                           "per seed, equal elsewhere")
    pack = _Pack(variant, configs, seeds, device, check_finite)
    step = 0
    while pack.members:
        step += 1
        with denormals_flushed():  # as fit() trains, so that a packed run gives its solo numbers
            leaving = pack.train_step(step)
            if on_progress is not None and pack.members:
                on_progress(step, pack.members[0].loss)
            due = [m for m in pack.members if step % m.config.eval_every == 0]
            leaving += pack.evaluate(due, last=False)
            at_budget = [m for m in pack.members if m not in leaving and step >= m.config.max_steps]
            # the model a run ends with is evaluated (its budget between two evaluations)
            pack.evaluate([m for m in at_budget if not m.loop.evaluated_now()], last=True)
        leaving += at_budget
        pack.drop([m for m in leaving if m in pack.members])
        for member in sorted(leaving, key=lambda m: m.index):
            yield member.index, pack.result(member)


def execute_packed(specs: list[RunSpec], device: torch.device, on_progress=None) -> Iterator[dict]:
    """Train ``specs`` (runs of one :func:`~fwbench.run.pack_plan.pack_key`) as one pack and yield each run's record as it
    ends, in the solo format (:func:`fwbench.run.execute.build_record`) plus ``"packed": {"runs": R}``.
    If the pack raises, the runs without a record yet come back as ``failed`` records."""
    started = utc_now()
    done: set[int] = set()
    try:
        for spec in specs:
            import_modules_of(spec)
        results = fit_packed(specs[0].variant, [s.task_config() for s in specs], [s.seed for s in specs],
                             device, on_progress)
        for index, result in results:
            done.add(index)
            yield {**build_record(specs[index], result, device, started), "packed": {"runs": len(specs)}}
    except FwbenchError:
        raise
    except Exception as exc:  # a broken pack must not take the grid down with it
        for index, spec in enumerate(specs):
            if index not in done:
                yield failed_record(spec, exc)
