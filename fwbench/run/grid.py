"""Grids are data: a TOML file names a task, shared defaults and named profiles; a profile expands
into the product of its list-valued keys, one :class:`RunSpec` (a run) per cell.

Example (``fwbench/grids/capacity.toml``)::

    name = "capacity"
    task = "retrieval"
    description = "Setting 1: best eval loss vs number of unique keys S"

    [defaults]            # any field of the task's config, plus `variant` and `seed`
    setting = 1

    [profiles.quick]      # a list makes an axis of the product
    variant = ["softmax", "linear", "dpfp:nu=1"]
    S = [20, 40, 80]
    seed = [1]

A profile may also be an array of tables (``[[profiles.quick]]`` blocks): its runs are the union of
the blocks' products (each block over ``defaults``), so a profile can pick targeted cells, e.g. many
variants at a small S and a few variants at a large S, without running the full product.

A grid may name the user's own variant modules, imported before its variants are parsed (here and in
every worker process: each run carries them)::

    variant_modules = ["my_attention.py"]   # paths relative to the grid file, or module names

A grid is named by a bundled name (``capacity``) or a path to a ``.toml`` file.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import numbers
import struct
import sys
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from fwbench.errors import FwbenchError, check_seed, one_line
from fwbench.tasks import TASKS
from fwbench.tasks.base import config_field_types
from fwbench.variants import VariantError, import_variant_modules, parse_spec
from fwbench.variants.errors import shown
from fwbench.variants.kernels.chunking import chunk_length
from fwbench.variants.kernels.precision import denormals_kept
from fwbench.variants.registry import check_spec

GRID_DIR = Path(__file__).resolve().parents[1] / "grids"
#: The grids ``fwbench reproduce`` runs, in order: together they regenerate the paper's claims
#: (shakespeare: the language-model claims C7–C10; it needs the corpus, see :mod:`fwbench.tasks.corpus`).
PAPER_GRIDS = ["capacity", "setting2", "capacity_nu", "mqar", "shakespeare"]
TOP_LEVEL_KEYS = {"name", "task", "description", "defaults", "profiles", "variant_modules"}
#: float32's smallest normal number (``torch.finfo(torch.float32).tiny``): a float setting of a smaller magnitude,
#: but not 0, is refused (:func:`refuse_tiny_floats`), unless its task computes it in float64.
FLOAT32_TINY = 1.1754943508222875e-38


def _nonzero(value: float) -> bool:
    """Whether ``value`` is not ±0.0, read from its bits: in a process flushing denormals (FTZ/DAZ) Python's own
    comparisons (and ``float.hex``) read a subnormal as 0, and ``grad_clip = 1e-320`` then passed as 0 under the
    run id of 0."""
    # a copy of the bits, no float operation; exactly +0.0 and -0.0 (a strip of the zero bytes also read
    # 2.848094538889218e-306 and six subnormals, whose only nonzero byte is 0x80, as 0)
    return struct.pack("<d", value) not in (bytes(8), bytes(7) + b"\x80")
RUN_KEYS = {"variant", "seed"}
#: The longest grid name, in UTF-8 bytes: ``fwbench capacity`` writes NAME.csv and NAME.png, and a file
#: name may hold 255 bytes (NAME_MAX on ext4, XFS, APFS, NTFS), four of them the suffix.
GRID_NAME_MAX_BYTES = 255 - len(".csv")
#: Bump when a change to the code makes old records incomparable; it is part of every run id. A task
#: whose own records alone changed meaning declares ``record_schema`` instead (hashed when set).
#: 2: LM training windows include the last start; FAVOR+ redraws from their own stream; the model
#: a run ends with is always evaluated; no ``Infinity`` for a best loss never measured.
RECORD_SCHEMA = 2


@dataclass(frozen=True)
class RunSpec:
    """One cell of a grid: task, variant spec (canonical), seed, the full task config and the
    user variant modules (resolved paths or module names) that define the variant, which every
    process that runs it imports first (see :func:`import_modules_of`)."""

    grid: str
    task: str
    variant: str
    seed: int
    config: dict[str, Any]
    variant_modules: tuple[str, ...] = ()

    @functools.cached_property
    def run_id(self) -> str:
        """Hash of the config as it acts (:func:`_acting_config`: a chunk size that no kernel of the variant uses
        left out, a chunk size as its chunk lengths, the task's ``values_as_they_act``, the patience as it acts)
        and of the variant as it computes (the task's ``acting_variant``: softmax with a window that no call
        reaches is softmax): runs that compute the same numbers get one id, whichever grid or invocation named
        them (``embedding_factor`` 2.0 and 2.2 at S = 4, or the LM's ``checkpoint_every``, gave two ids, and a
        second invocation retrained the run). The variant modules are not hashed: the spec names the variant.
        Computed once (where the grid is expanded) and kept, so a worker receives it with the run. A spec of a
        task this process does not know is hashed as given (a worker's failed record of it needs an id)."""
        return self._hash(_hashed_config(self) if self.task in TASKS else dict(self.config))

    @functools.cached_property
    def given_id(self) -> str:
        """The hash of the config as given (only the task's ``acting_config`` applied): two cells of one grid
        whose ids are equal but given ids differ hold values that act alike (:func:`_refuse_equal_computations`
        names them); equal given ids, keys with no effect (:func:`_same_run`)."""
        return self._hash(_given_config(self))

    def _hash(self, config: dict[str, Any]) -> str:
        import_modules_of(self)
        task = TASKS.get(self.task)
        payload = {"schema": RECORD_SCHEMA, "task": self.task, "variant": self.acting_variant,
                   "seed": self.seed, "config": config}
        if getattr(task, "record_schema", None):  # a task whose records changed meaning on their own
            payload["task_schema"] = task.record_schema
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    @functools.cached_property
    def acting_variant(self) -> str:
        """The variant spec as it computes in this run (the task's ``acting_variant``; default: the
        spec): softmax with a window that no call reaches is softmax. The run id and the grid's
        refusals of equal computations compare runs by it."""
        import_modules_of(self)
        task = TASKS.get(self.task)
        if hasattr(task, "acting_variant"):
            return task.acting_variant(self.task_config(), self.variant)
        return self.variant

    def task_config(self):
        """The task's typed config dataclass for this run (:func:`task_config_of`).

        Raises:
            FwbenchError: an unknown task, or a config key the task does not have (a spec built in Python,
                not by the grid loader, which refuses both first).
        """
        return task_config_of(self.task, self.config)

    @property
    def label(self) -> str:
        axes = ", ".join(f"{k}={v}" for k, v in self.config.items() if k in ("S", "setting", "d_model"))
        return f"{self.variant} [{axes}] seed={self.seed}"


# the keys a progress label names first where runs share a label (the grid's two learning rates, its carried-state
# runs beside the limited-context ones); the others follow in name order
_LABEL_KEYS_FIRST = ("lr", "train_segments")


def shown_labels(specs: list[RunSpec]) -> dict[str, str]:
    """Run id → what the progress bar shows for each of ``specs``: its :attr:`RunSpec.label`, and where runs share
    one, up to two config values that tell them apart, ``"linear [d_model=64] seed=1 (lr=0.012)"`` (the same label
    twice read as a run trained again)."""
    groups: dict[str, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.label, []).append(spec)
    shown = {}
    for label, alike in groups.items():
        keys = sorted({key for spec in alike for key in spec.config},
                      key=lambda key: (key not in _LABEL_KEYS_FIRST, _LABEL_KEYS_FIRST.index(key)
                                       if key in _LABEL_KEYS_FIRST else 0, key))
        differing = [key for key in keys
                     if len({json.dumps(spec.config.get(key), sort_keys=True, default=str) for spec in alike}) > 1][:2]
        for spec in alike:
            values = ", ".join(f"{key}={spec.config.get(key)}" for key in differing)
            shown[spec.run_id] = f"{label} ({values})" if values else label
    return shown


@dataclass(frozen=True)
class Grid:
    """A parsed grid file."""

    name: str
    task: str
    description: str
    defaults: dict[str, Any]
    profiles: dict[str, dict[str, Any]]
    path: Path
    #: user variant modules, resolved (absolute paths or module names), imported by :func:`load_grid`
    variant_modules: tuple[str, ...] = ()
    #: things worth knowing that are not errors (a ``max_steps`` that is not a multiple of ``eval_every``)
    warnings: tuple[str, ...] = ()


def import_modules_of(spec: RunSpec) -> None:
    """Import the user variant modules a run needs in this process (once per process).

    Raises:
        FwbenchError: a module that cannot be found or imported.
    """
    try:
        import_variant_modules(spec.variant_modules)
    except VariantError as exc:
        raise FwbenchError(f"run {spec.variant}: {exc}") from None


def available_grids() -> list[str]:
    """Names of the grids bundled with fwbench."""
    return sorted(p.stem for p in GRID_DIR.glob("*.toml"))


def grid_path(name_or_path: str | Path) -> Path:
    """Resolve a bundled grid name or a file path. Raises :class:`FwbenchError` if neither exists."""
    path = Path(name_or_path)
    # Path("") is ".", the working directory: '' (an unset variable) was named "file '.' does not exist"
    if str(name_or_path) and (path.suffix == ".toml" or path.exists()):
        if path.is_dir():
            raise FwbenchError(f"grid: {str(path)!r} is a directory; expected a .toml grid file or a bundled grid name")
        if not path.is_file():
            raise FwbenchError(f"grid: file {str(path)!r} does not exist")
        return path
    bundled = GRID_DIR / f"{name_or_path}.toml"
    if not str(name_or_path) or not bundled.is_file():
        raise FwbenchError(
            f"grid: got {str(name_or_path)!r}; expected a path to a .toml file or one of {', '.join(available_grids())}"
        )
    return bundled


def _shown(name: str) -> str:
    """``repr(name)``, cut to its first 60 characters with its length in bytes when longer (an error stays
    a readable line)."""
    if len(name) <= 60:
        return repr(name)
    return f"{name[:60]!r}… ({len(name.encode('utf-8'))} bytes in UTF-8)"


def load_grid(name_or_path: str | Path) -> Grid:
    """Parse and validate a grid file.

    Raises:
        FwbenchError: unreadable or malformed TOML (with its line), unknown task, typo'd key
            (listing the allowed keys), a value of the wrong type, a name that is no file name (it
            names ``fwbench capacity``'s files), a bad variant spec, or a profile without runs.
    """
    path = grid_path(name_or_path)
    # every message below names the grid on its one line: a file name holding a newline split it
    shown = one_line(path)
    try:
        with denormals_kept():  # under DAZ, Python's float() read 1e-320 as 0.0 and -1e-320 as -0.0 (accepted)
            data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise FwbenchError(f"grid {shown}: malformed TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FwbenchError(f"grid {shown}: cannot read: {exc}") from None
    except ValueError:  # tomllib's int() of over 4300 digits (int_max_str_digits) raised a bare traceback
        raise FwbenchError(f"grid {shown}: an integer of over {sys.get_int_max_str_digits()} digits, which Python "
                           "does not read; expected sizes of at most 2**63 - 1") from None
    unknown = set(data) - TOP_LEVEL_KEYS
    if unknown:
        raise FwbenchError(
            f"grid {shown}: unknown top-level key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(TOP_LEVEL_KEYS))}"
        )
    task = data.get("task")
    if task not in TASKS:
        raise FwbenchError(f"grid {shown}: task: got {task!r}; expected one of {', '.join(TASKS)}")
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise FwbenchError(f"grid {shown}: needs at least one [profiles.NAME] table")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise FwbenchError(f"grid {shown}: [defaults] must be a table")
    for profile, table in profiles.items():
        blocks = table if isinstance(table, list) and table else [table]
        if not all(isinstance(block, dict) for block in blocks):
            raise FwbenchError(
                f"grid {shown}: profiles.{profile}: got {table!r} ({type(table).__name__}); expected a table "
                f"[profiles.{profile}] of keys (or an array of tables [[profiles.{profile}]])"
            )
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise FwbenchError(f"grid {shown}: {key}: got {data[key]!r} ({type(data[key]).__name__}); expected str")
    name = data.get("name", path.stem)
    # the name names files: `fwbench capacity` writes OUT/NAME.csv and OUT/NAME.png, so "/tmp/x" or "../x"
    # wrote outside --out, "" wrote the hidden files .csv and .png.png, a NUL raised a traceback, and a
    # name longer than a file name may be (NAME_MAX, 255 bytes on Linux, macOS and Windows file systems,
    # less the suffix) raised "File name too long" after every run had trained
    if name in ("", ".", "..") or any(c in name for c in "/\\") or not name.isprintable() \
            or len(name.encode("utf-8")) > GRID_NAME_MAX_BYTES:
        raise FwbenchError(f"grid {shown}: name: got {_shown(name)}; expected a name that is a file name: not empty, not "
                           f"'.' or '..', without '/', '\\' or control characters, at most {GRID_NAME_MAX_BYTES} bytes "
                           "in UTF-8 (fwbench capacity writes NAME.csv and NAME.png into --out)")
    modules = data.get("variant_modules", [])
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise FwbenchError(f"grid {shown}: variant_modules: got {modules!r}; expected a list of strings "
                           "(paths to .py files relative to the grid file, or module names)")
    try:
        modules = import_variant_modules(modules, relative_to=path.resolve().parent)
    except VariantError as exc:
        raise FwbenchError(f"grid {shown}: {exc}") from None
    grid = Grid(name, task, data.get("description", ""), defaults, profiles, path, modules)
    notes = []
    for profile in profiles:
        specs = expand(grid, profile)  # validates every profile up front
        notes += _schedule_warnings(grid.name, profile, specs)
    return replace(grid, warnings=tuple(notes))


def _schedule_warnings(grid_name: str, profile: str, specs: list[RunSpec]) -> list[str]:
    """One line per (max_steps, eval_every) pair of a profile where the budget falls between two
    evaluations: such a run is evaluated once more, at its last step, off the schedule."""
    pairs = sorted({(s.config["max_steps"], s.config["eval_every"]) for s in specs
                    if "max_steps" in s.config and "eval_every" in s.config})
    return [f"grid {grid_name} profile {profile}: max_steps {steps} is not a multiple of eval_every {every}; "
            f"runs that reach it are also evaluated at step {steps}, off the every-{every} schedule"
            for steps, every in pairs if steps % every]


def _check_value(where: str, key: str, value: Any, expected: type) -> Any:
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # lr = 1 followed by 400 zeros: a bare traceback
            raise FwbenchError(f"{where}: {key}: got {shown(value)}; expected a finite number") from None
    if not ok:
        raise FwbenchError(f"{where}: {key}: got {shown(value)} ({type(value).__name__}); expected {expected.__name__}")
    if expected is float and not math.isfinite(value):
        raise FwbenchError(f"{where}: {key}: got {value!r}; expected a finite number")
    if expected is float and not _nonzero(value):
        # -0.0 acts as 0.0 in every comparison a config makes (dropout, grad_clip, target_loss, temperature)
        # but json.dumps writes it "-0.0": it was a second run id for one computation
        return 0.0
    if key == "seed":
        check_seed(value, f"{where}: seed")
    return value


def _is_default(field: Any, value: float) -> bool:
    """Whether ``value`` has the bits of ``field``'s default (a float default; no default factory)."""
    return isinstance(field.default, float) and struct.pack("<d", field.default) == struct.pack("<d", value)


def check_task_config(where: str, task: Any, config: Any, *, run_id_types: bool = True) -> Any:
    """``task.validate(config)``, then :func:`refuse_tiny_floats`, with denormal floats kept: the grid loader, a
    spec's run id and a run's own start (:func:`fwbench.run.training.fit`, which trains with denormals flushed) make
    the same checks, and each reads a subnormal value as itself (under DAZ, MQAR ``power_a = 5e-324`` was refused
    as "got 0.0", and a spec run by ``execute`` trained to its end with ``lr = 1e-320``, read as 0, before its
    record's run id refused it).

    ``run_id_types``: the types a run id can hash (a Python int, not a NumPy one, which ``json.dumps`` refuses); a
    config given to ``fit`` or ``fit_packed``, which make no run id, may hold any real number (NumPy scalars
    trained there before), and may be any object with the config's attributes.

    Returns:
        ``config``; with ``run_id_types=False``, a copy holding each real number as the Python number it was checked
        as, which the run trains with (an np.float32 lr of 1e-40 passed the tiny rule, which reads Python floats,
        and a Fraction lr reached torch's Adam: break-it pass AY).

    Raises:
        FwbenchError: ``"{where}: "`` and the message of the first check that fails.
    """
    if isinstance(config, type):  # fit(..., RetrievalConfig, ...): dataclasses.fields' TypeError
        raise FwbenchError(f"{where}: got the class {config.__name__}; expected an instance of it")
    with denormals_kept():
        # a config built in code and given to fit() (the grid and a spec's task_config check these first): lr = nan
        # raised torch's 'Invalid learning rate', lr = '0.001' a TypeError from validate (break-it pass AW)
        if is_dataclass(config):
            values = {field.name: getattr(config, field.name) for field in fields(config)}
            checked = _check_field_types(where, type(config), values, numbers_of_any_type=not run_id_types)
            if not run_id_types:
                config = replace(config, **{name: value for name, value in checked.items()
                                            if type(value) is not type(values[name])})
        try:
            task.validate(config)
        except ValueError as exc:  # VariantError and FwbenchError are ValueErrors
            raise FwbenchError(f"{where}: {exc}") from None
        refuse_tiny_floats(where, task, config)
    return config


def refuse_tiny_floats(where: str, task: Any, config: Any) -> None:
    """Refuse a float setting of ``config`` (a task's config dataclass) whose magnitude is below the smallest
    normal number of the precision it is computed in, but not 0. Training runs in float32 with denormals flushed
    (FTZ/DAZ, which also reads a float64 subnormal as 0 in Python's own comparisons), where such a value is
    exactly 0: ``grad_clip = 1e-320`` clipped nothing (the strongest clip read as none), ``lr = 1e-50`` and
    ``1e-300`` were each lr = 0, under two run ids. A key the task lists in its ``float64_keys`` (MQAR's power
    law, the LM's split of the corpus and its sampling temperature) is refused only below float64's smallest
    normal number; a subnormal is refused for every key. Called after the task's ``validate``, so that a value
    out of its range is named by that rule (``grad_clip = -1e-39``: ``grad_clip >= 0``), not by this one.

    A tiny value that is a normal number acts, however little (``lr = 1e-20`` moves a weight at 0): which
    values round away against the weights depends on the weights, which no loader sees.

    Raises:
        FwbenchError: naming the key, the value and the smallest magnitude allowed.
    """
    if not is_dataclass(config):
        return
    float64_keys = getattr(task, "float64_keys", frozenset())
    for field in fields(config):
        value = getattr(config, field.name)
        if not isinstance(value, float) or not _nonzero(value) or _is_default(field, value):
            continue  # a task's own default (a registered task's eps = 1e-300) is its author's choice
        smallest, which = ((sys.float_info.min, "float64, as the task computes it") if field.name in float64_keys
                           else (FLOAT32_TINY, "float32 training"))
        if abs(value) < smallest:
            raise FwbenchError(
                f"{where}: {field.name}: got {value!r}; expected a magnitude of at least {smallest!r}, or 0 where "
                f"{field.name} allows it (the smallest normal number of {which}, which runs with denormals flushed "
                "and reads a smaller one as 0)")


def _canonical_spec(spec: str) -> str:
    """``spec`` as it parses (``dpfp`` → ``dpfp:nu=1``), or as written where it does not parse."""
    try:
        return str(parse_spec(spec))
    except VariantError:
        return spec


def refuse_repeated_value(name: str, given: list, values: list, where: str) -> None:
    """Refuse an axis listing one value twice (``seed = [1, 1]``, ``--seeds 1 1``, ``dropout = [0.0, -0.0]``,
    ``variant = ["dpfp", "dpfp:nu=1"]``, specs compared as they parse): each names the same runs twice.
    ``given``: the values as written; ``values``: as read.

    Raises:
        FwbenchError: naming the key (or option) and the value.
    """
    if name == "variant":  # a spec that does not parse is refused where the cells are built, naming it
        values = [_canonical_spec(spec) for spec in values]
    for index, value in enumerate(values):
        if value not in values[:index]:
            continue
        first = given[values.index(value)]
        prefix = f"{where}: " if where else ""
        if repr(first) == repr(given[index]):
            raise FwbenchError(f"{prefix}{name}: lists {first!r} twice; list each value once")
        raise FwbenchError(f"{prefix}{name}: {first!r} and {given[index]!r} are one value ({value!r}); list each "
                           "value once")


def expand(grid: Grid, profile: str, seeds: list[int] | None = None) -> list[RunSpec]:
    """Every run of ``profile``: the product of its list-valued keys over ``defaults`` (for a
    profile made of blocks, the union of the blocks' products, duplicates dropped, in order).

    ``seeds`` replaces the profile's seed axis when given.

    Raises:
        FwbenchError: unknown profile (lists the profiles), typo'd key (lists the allowed keys),
            wrong value type, bad variant spec, invalid task config, an empty product, or two runs
            that compute the same numbers (:func:`_refuse_equal_computations`).
    """
    if profile not in grid.profiles:
        raise FwbenchError(f"--profile: got {profile!r}; grid {grid.name} has {', '.join(grid.profiles)}")
    if seeds is not None and not seeds:
        raise FwbenchError("--seeds: got an empty list; expected one or more integers")
    blocks = grid.profiles[profile]
    if isinstance(blocks, dict):
        return _expand_block(grid, profile, blocks, seeds, f"grid {grid.name} profile {profile}")
    if not isinstance(blocks, list) or not blocks or not all(isinstance(b, dict) for b in blocks):
        raise FwbenchError(f"grid {grid.name} profile {profile}: expected a table or a non-empty array of tables")
    specs: dict[str, RunSpec] = {}
    for index, block in enumerate(blocks, start=1):
        where = f"grid {grid.name} profile {profile} block {index}"
        for spec in _expand_block(grid, profile, block, seeds, where):
            specs.setdefault(spec.given_id, spec)  # one cell listed by two blocks; cells that act alike are refused
    _refuse_equal_computations(f"grid {grid.name} profile {profile}", list(specs.values()))
    return list(specs.values())


def _expand_block(grid: Grid, profile: str, block: dict[str, Any], seeds: list[int] | None,
                  where: str) -> list[RunSpec]:
    """The product of one profile table's list-valued keys over ``defaults``."""
    entries = {**grid.defaults, **block}
    if seeds is not None:
        entries["seed"] = list(seeds)
    task = TASKS[grid.task]
    types = config_field_types(task.config_class)
    allowed = sorted(RUN_KEYS | set(types))
    for key in entries:
        if key not in types and key not in RUN_KEYS:
            raise FwbenchError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(allowed)}")
    for key in RUN_KEYS:
        if key not in entries:
            raise FwbenchError(f"{where}: missing key {key!r} (a value or a list of values)")
    axes = {k: (v if isinstance(v, list) else [v]) for k, v in entries.items()}
    for key, values in axes.items():
        if not values:
            raise FwbenchError(f"{where}: {key} is an empty list; the grid would have no runs")
        expected = {"variant": str, "seed": int}.get(key) or types[key]
        axes[key] = [_check_value(where, key, v, expected) for v in values]
        refuse_repeated_value("--seeds" if key == "seed" and seeds is not None else key, values, axes[key], where)
    specs = []
    keys = list(axes)
    for combination in itertools.product(*(axes[k] for k in keys)):
        cell = dict(zip(keys, combination))
        try:
            variant = str(parse_spec(cell.pop("variant")))
        except VariantError as exc:
            raise FwbenchError(f"{where}: {exc}") from None
        seed = cell.pop("seed")
        config = task.config_class(**cell)
        spec = RunSpec(grid.name, grid.task, variant, seed, asdict(config), grid.variant_modules)
        check_task_config(where, task, config)
        try:
            spec.given_id  # noqa: B018 -- refuses settings the variant cannot run (a form its rule lacks)
        except ValueError as exc:  # VariantError is a ValueError
            raise FwbenchError(f"{where}: {exc}") from None
        if hasattr(config, "d_key"):  # DPFP's ν < 2·d_key, FAVOR+'s m ≤ 2**16: checked when a run built its model
            try:
                check_spec(variant, config.d_key)
            except VariantError as exc:
                raise FwbenchError(f"{where}: variant {variant} at d_key {config.d_key}: {exc}") from None
        specs.append(spec)
    seen: dict[str, RunSpec] = {}
    for spec in specs:
        if spec.given_id in seen:
            raise FwbenchError(f"{where}: {_same_run(seen[spec.given_id], spec)}")
        seen[spec.given_id] = spec
    _refuse_equal_computations(where, specs)  # every two cells with one run_id are refused here, if not above
    return specs


def _chunks_as_they_act(task: Any, config: Any, chunk_size: int) -> tuple[Any, str] | None:
    """What a chunk size acts as in the run (its chunk length, or lengths) and the words saying why, or ``None``
    where the task does not say how long its chunked calls are.

    The chunk forms balance their chunks (:func:`~fwbench.variants.kernels.chunking.chunk_length`):
    at T = 120, chunk sizes 60 to 119 all run 2 chunks of 60 tokens and compute the same numbers, so
    the run id hashes the chunk length (:func:`_hashed_config`). A task whose chunked calls all cover one
    length T says so with ``chunked_tokens``; one whose calls cover any length from 1 to L tokens (the LM: a
    segment, or part of one) says L with
    ``longest_chunked_call``: two chunk sizes cut every such call alike only where both are at least L
    (below L, the size a + 1 is cut by a in two and by a larger size in one), so a size acts as min(size, L).
    Where such a task also knows the lengths of all its calls (``chunked_call_lengths``: the LM on its
    verified corpus), a size below L acts as the chunk lengths it cuts them into, and one of at least L as
    the lengths themselves (each call in one chunk).
    """
    if hasattr(task, "chunked_tokens"):
        T = task.chunked_tokens(config)
        length = chunk_length(T, chunk_size)
        return length, (f"cut its T={T} tokens into {-(-T // length)} {'chunk' if length >= T else 'chunks'} of at "
                        f"most {length} tokens (the chunk forms balance their chunks)")
    lengths = sorted(task.chunked_call_lengths(config) or ()) if hasattr(task, "chunked_call_lengths") else []
    if lengths:  # a size of at least the longest call leaves each call in one chunk: its cuts are the lengths
        cuts = tuple(chunk_length(T, chunk_size) for T in lengths)
        if chunk_size >= lengths[-1]:
            return cuts, f"leave every attention call of at most {lengths[-1]} tokens in one chunk"
        return cuts, (f"cut each attention call of the run ({', '.join(map(str, lengths))} tokens) into chunks of "
                      "one length (the chunk forms balance their chunks)")
    if hasattr(task, "longest_chunked_call"):
        longest = task.longest_chunked_call(config)
        return min(chunk_size, longest), f"leave every attention call of at most {longest} tokens in one chunk"
    return None


def _patience_as_it_acts(config: dict[str, Any]) -> tuple[int, str] | None:
    """What ``patience`` acts as in the training loop (:mod:`fwbench.run.training`, and a pack's), and
    why; ``None`` for a config without ``patience``, ``eval_every`` and ``max_steps``.

    A plateau is declared only at a scheduled evaluation (steps k · ``eval_every`` ≤ ``max_steps``),
    once ``patience`` of them in a row brought no new best; the first evaluation is always a best, so a
    run with n = max_steps // eval_every scheduled evaluations counts at most n − 1 without one, and
    every patience of at least n acts as n: it never stops the run (``patience = [20, 50]`` at
    ``max_steps = 1000``, ``eval_every = 100`` trained one run under two ids).
    """
    if not all(isinstance(config.get(key), int) for key in ("patience", "eval_every", "max_steps")):
        return None
    scheduled = config["max_steps"] // config["eval_every"]
    return min(config["patience"], scheduled), (
        f"max_steps={config['max_steps']} with eval_every={config['eval_every']} schedules {scheduled} "
        f"evaluation{'' if scheduled == 1 else 's'}, so a patience of {scheduled} or more never stops the run")


def _as_it_computes(spec: RunSpec) -> tuple[tuple, dict[str, tuple[Any, str]]]:
    """A key equal for two cells that compute the same numbers, and for each key normalised in it the
    value the run acts with and why: the acting config (the run id's), with the chunk size as its
    chunk length (:func:`_chunks_as_they_act`), the task's ``values_as_they_act`` and the patience as it
    acts (:func:`_patience_as_it_acts`) applied together,
    so that two cells differing in both (chunk_size 32 and 64 at context 32, checkpoint_every 0 and
    100) are caught as well as cells differing in one."""
    acting, normalised = _acting_config(spec)
    return (spec.acting_variant, spec.seed, json.dumps(acting, sort_keys=True)), normalised


def stored_config(spec: RunSpec) -> dict[str, Any]:
    """The config a record of ``spec`` stores: as given, with -0.0 as 0.0, as its run id reads it (a spec built in
    Python stored ``"target_loss": -0.0`` where a grid's record stores 0.0)."""
    if not isinstance(spec.config, dict):  # a failed record of a spec built in Python with no dict: stored as given
        return spec.config
    return {key: 0.0 if isinstance(value, float) and not _nonzero(value) else value for key, value in spec.config.items()}


def task_config_of(task: str, config: dict[str, Any]):
    """``config`` as the typed config dataclass of ``task`` (for a spec built in Python, a checkpoint's
    config, a record's).

    Raises:
        FwbenchError: ``task`` unknown (a bare ``KeyError`` before), or a key of ``config`` the task's config
            does not have (the dataclass raised a bare ``TypeError``: ``got an unexpected keyword argument``).
    """
    if task not in TASKS:
        raise FwbenchError(f"task: got {task!r}; expected one of {', '.join(sorted(TASKS))}")
    config_class = TASKS[task].config_class
    unknown = sorted(set(config) - {field.name for field in fields(config_class)})
    if unknown:
        raise FwbenchError(f"config: got the key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}, "
                           f"which task {task!r} does not have; expected keys of "
                           f"{config_class.__name__} ({', '.join(f.name for f in fields(config_class))})")
    # the grid loader's type check, for a spec built in Python: S='4', context=16.0, a NumPy int (which json.dumps
    # of the run id refuses) or None where no default is None crashed in the run id or the run with a bare TypeError.
    return config_class(**_check_field_types(f"{task} config", config_class, config))


def _check_field_types(where: str, config_class: type, config: dict[str, Any], *,
                       numbers_of_any_type: bool = False) -> dict[str, Any]:
    """``config`` (keys of ``config_class``) with each value of a plain-typed field checked as the grid loader
    checks it (:func:`_check_value`). Checked, not converted: an int lr stays an int, so the run ids of such specs
    are the ones they always had. But -0.0 is read as 0.0, as the grid reads it: it was a second run id for the
    run of 0.0 (break-it pass AU).

    ``numbers_of_any_type``: a real number of any type (a NumPy scalar) is taken for a float field, an integral one
    for an int field, each checked as the Python number it converts to.

    Raises:
        FwbenchError: naming the key, the value and the type or range expected.
    """
    config = dict(config)
    for field in fields(config_class):
        if field.name not in config:
            continue
        value, expected = config[field.name], _plain_type(field)
        nullable = field.default is None or "None" in str(field.type)
        if numbers_of_any_type and not isinstance(value, bool) and (
                (expected is float and isinstance(value, numbers.Real))
                or (expected is int and isinstance(value, numbers.Integral))):
            try:  # lr = Fraction(10**400): float() overflows
                number = expected(value)
            except OverflowError:
                raise FwbenchError(f"{where}: {field.name}: got {shown(value)}; expected a finite number") from None
            config[field.name] = _check_value(where, field.name, number, expected)
            continue
        if expected is not None and not (value is None and nullable):
            checked = _check_value(where, field.name, value, expected)
            if isinstance(value, float):
                config[field.name] = checked
    return config


def _plain_type(field: Any) -> type | None:
    """The type a config field's annotation names where it is int, float, str or bool (``| None`` allowed), else
    ``None``: a field a task annotates otherwise (``tuple[int, ...]``) is not checked (config_field_types read it as
    str, and a registered task's own default was refused)."""
    plain = {"int": int, "float": float, "str": str, "bool": bool}
    if isinstance(field.type, type):
        return field.type if field.type in plain.values() else None
    return plain.get(str(field.type).replace(" ", "").removesuffix("|None"))


def _given_config(spec: RunSpec) -> dict[str, Any]:
    """The config as given, less the keys that do not act for the variant (the task's ``acting_config``)."""
    task = TASKS.get(spec.task)
    return task.acting_config(spec.task_config(), spec.variant) if hasattr(task, "acting_config") else dict(spec.config)


def _hashed_config(spec: RunSpec) -> dict[str, Any]:
    """The config :attr:`RunSpec.run_id` hashes: the task's ``acting_config`` as given, except each key whose value
    :func:`_acting_config` normalises: its default where the default acts the same (so the id of a run stored
    with the default is kept, and every value that acts as the default shares it), else the value it acts as
    (two values that act alike, neither as the default, share that).

    Raises:
        FwbenchError: a config the task's ``validate`` refuses (a spec built in Python: the grid loader validates
            first), before any value is normalised: MQAR's seq_len = 2**62 raised torch's RuntimeError from the
            gap distribution ``values_as_they_act`` computes.
    """
    check_seed(spec.seed, "seed")  # a spec built in Python: the grid loader checks its own
    check_task_config(f"{spec.task} config", TASKS[spec.task], spec.task_config())
    acting, normalised = _acting_config(spec)
    hashed = _given_config(spec)
    defaults, given = config_defaults(spec.task), asdict(spec.task_config())  # a spec may name only some keys
    for key in normalised:
        if key not in hashed or key not in defaults or given[key] == defaults[key]:
            continue
        default = replace(spec, config={**given, key: defaults[key]})
        try:
            alike = _acting_config(default)[0].get(key) == acting[key]
        except ValueError:  # a default the other keys do not allow: no default to share
            alike = False
        # alike: as the default's run hashes it (acting_config may write an unset chunk size as the rule's default)
        hashed[key] = _given_config(default).get(key, defaults[key]) if alike else acting[key]
    return hashed


def _acting_config(spec: RunSpec) -> tuple[dict[str, Any], dict[str, tuple[Any, str]]]:
    """The config as the run acts with it (:func:`_hashed_config` hashes it where no default acts alike), and for
    each key normalised in it the value as given and why (see :func:`_as_it_computes`)."""
    import_modules_of(spec)
    task, config = TASKS[spec.task], spec.task_config()
    given = asdict(config)  # a spec may name only some keys (the rest: the task's defaults)
    acting = _given_config(spec)
    normalised: dict[str, tuple[Any, str]] = {}
    chunks = None if "chunk_size" not in acting else _chunks_as_they_act(task, config, acting["chunk_size"])
    if chunks is not None:
        normalised["chunk_size"] = (acting["chunk_size"], chunks[1])
        acting["chunk_size"] = chunks[0]
    if hasattr(task, "values_as_they_act"):
        for name, (value, why) in task.values_as_they_act(config).items():
            normalised[name] = (given[name], why)
            acting[name] = value
    patience = _patience_as_it_acts(given)
    if patience is not None and "patience" in acting:
        normalised["patience"] = (given["patience"], patience[1])
        acting["patience"] = patience[0]
    return acting, normalised


def _refuse_equal_computations(where: str, specs: list[RunSpec]) -> None:
    """Refuse two cells that compute the same numbers under two run ids: chunk sizes that cut every
    call alike (:func:`_chunks_as_they_act`), and values a task says act as one
    (``values_as_they_act(config)``, key → (the value it acts as, why): the retrieval model's key
    embedding has int(embedding_factor · S) features, so at S = 20 ``embedding_factor`` 2.2 and 2.21
    build one model; the LM's ``checkpoint_every`` says only where a run could resume from), alone or
    together.

    Raises:
        FwbenchError: naming each key whose two values act alike, and why.
    """
    seen: dict[tuple, tuple[RunSpec, dict]] = {}
    for spec in specs:
        key, normalised = _as_it_computes(spec)
        first, first_normalised = seen.setdefault(key, (spec, normalised))
        if first is spec:
            continue
        reasons = []
        # a value may act as another on one side only (eval_segments 0 and 10⁶): the reason of either side
        for name, (_, why) in {**first_normalised, **normalised}.items():
            before = first_normalised.get(name, (first.config.get(name), why))[0]
            after = normalised.get(name, (spec.config.get(name), why))[0]
            if before == after:
                continue
            if name == "chunk_size":
                reasons.append(f"chunk_size {before} and {after} both {why}")
            else:
                reasons.append(f"{name} {before!r} and {after!r} act alike ({why})")
        raise FwbenchError(f"{where}: the run {spec.label} appears twice: {'; '.join(reasons)}, which compute the "
                           "same numbers; list one of them")


def _same_run(first: RunSpec, second: RunSpec) -> str:
    """Why two cells of a grid have one run id: variants that compute alike (the task's
    ``acting_variant``), or config keys whose values differ but do not act for the variant (a chunk
    size where no kernel it runs is chunked, or one equal to the rule's default)."""
    differing = [key for key in first.config if first.config[key] != second.config.get(key)]
    # variants are canonical spec strings: two that differ name one run only through the task's acting_variant
    variants = (f"variants {first.variant} and {second.variant} compute alike (both as {first.acting_variant}: "
                "softmax's window reaches every key of every attention call of the run)"
                if first.variant != second.variant else "")
    if not differing:  # (one value listed twice is refused before the cells are built: refuse_repeated_value)
        return f"the run {first.label} appears twice: {variants}; list one of them"
    task = TASKS[first.task]
    acting = task.acting_config(first.task_config(), first.variant) if hasattr(task, "acting_config") else {}
    form = first.config.get("form", "auto")
    inactive = task.inactive_keys(first.task_config(), first.variant) if hasattr(task, "inactive_keys") else {}
    reasons = [variants] if variants else []
    for key in differing:
        values = f"{first.config[key]!r} and {second.config[key]!r}"
        if key in inactive:
            reasons.append(f"{key} ({values}) has no effect: {inactive[key]}")
        elif key == "eval_every" and min(first.config[key], second.config[key]) > first.config.get("max_steps", math.inf):
            reasons.append(f"eval_every ({values}) has no effect: both exceed max_steps={first.config['max_steps']}, so "
                           "the run is evaluated at its last step only")
        elif key in acting:
            reasons.append(f"{key} {values} act alike for variant {first.variant} (both run with {key}={acting[key]!r})")
        elif key == "chunk_size":
            reasons.append(f"chunk_size ({values}) has no effect for variant {first.variant} with form={form!r}: no "
                           "kernel it runs there is chunked")
        else:
            reasons.append(f"{key} ({values}) has no effect for variant {first.variant}")
    return (f"the run {first.label} appears twice: {'; '.join(reasons)}; list one value of "
            f"{', '.join(differing)} for this variant (a separate profile block, [[profiles.NAME]], can vary it "
            "for the others)")


def config_defaults(task_name: str) -> dict[str, Any]:
    """Default value of every config field of a task (for documentation and ``fwbench grids``)."""
    return {f.name: f.default for f in fields(TASKS[task_name].config_class)}


def _grids_having(profile: str, grids: dict[str, Grid]) -> str:
    """'every paper grid', 'all but mqar' or 'shakespeare only': which of ``grids`` define ``profile``."""
    having = [name for name, grid in grids.items() if profile in grid.profiles]
    if len(having) == len(grids):
        return "every paper grid"
    if len(having) > len(grids) / 2:
        return "all but " + ", ".join(name for name in grids if name not in having)
    return ", ".join(having) + " only"


def paper_grids_with(profile: str) -> list[str]:
    """The grids of :data:`PAPER_GRIDS` that define ``profile``, in order. A grid without it is left out
    with a note (the `paper` profile runs no MQAR: no claim of the paper reads it).

    Raises:
        FwbenchError: no paper grid defines ``profile`` (names the profiles that exist).
    """
    grids = {name: load_grid(name) for name in PAPER_GRIDS}
    having = [name for name, grid in grids.items() if profile in grid.profiles]
    if not having:
        known = sorted({p for grid in grids.values() for p in grid.profiles})
        raise FwbenchError(f"--profile: got {profile!r}; expected one of "
                           + ", ".join(f"{p} ({_grids_having(p, grids)})" for p in known))
    for name in PAPER_GRIDS:
        if name not in having:
            print(f"fwbench: grid {name} has no profile {profile!r}: skipped", file=sys.stderr)
    return having
