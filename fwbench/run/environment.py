"""Where a run happens: device resolution and the facts every record carries for provenance."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import torch

from fwbench.errors import FwbenchError, refuse_empty_path
from fwbench.run.allocator import TUNING_ENV, malloc_tuning_active
from fwbench.tasks.corpus import CACHE_DIR_ENV, DATA_DIR_ENV, CorpusError, data_dir_candidates, expanded_path
from fwbench.variants.kernels.fla_dispatch import FLA_ENV
from fwbench.variants.kernels.precision import denormals_are_flushed, denormals_flushed

DEVICE_CHOICES = ("auto", "cpu", "cuda")
#: Environment variables that change what a run does: the data directory (``--data-dir`` sets it),
#: the corpus cache, the allocator tuning and the fla dispatch switch. A run executed in another process (a Ray worker of a
#: cluster started elsewhere) receives their values as they are here (:func:`run_settings`).
RUN_SETTINGS_ENV = (DATA_DIR_ENV, CACHE_DIR_ENV, TUNING_ENV, FLA_ENV)
#: The switches among them, whose unset value means their default (on): a worker whose own environment
#: sets one that the launching process leaves unset has it removed, and runs the default that was asked for.
SWITCH_ENV = (TUNING_ENV, FLA_ENV)


#: The directories among them: sent as absolute paths, since a worker resolves a relative one against its
#: own working directory (a cluster started elsewhere looked for ``FWBENCH_DATA_DIR=data`` in its own).
PATH_ENV = (DATA_DIR_ENV, CACHE_DIR_ENV)


def run_settings() -> dict[str, str]:
    """The :data:`RUN_SETTINGS_ENV` variables set in this process, name → value; the
    :data:`PATH_ENV` directories made absolute here (``~`` expanded), empty values left as they are.

    Raises:
        FwbenchError: a directory starting with ``~user`` that names no user of this machine, or a data directory
            naming something that is not a directory.
    """
    settings = {name: os.environ[name] for name in RUN_SETTINGS_ENV if name in os.environ}
    for name in PATH_ENV:
        if settings.get(name):
            try:
                if name == DATA_DIR_ENV:  # a file there: Ray recorded every LM run failed, and exited 0
                    data_dir_candidates(None)
                # realpath, not Path.resolve, which raised "RuntimeError: Symlink loop" (a traceback from
                # --launcher ray) for a directory that is a link looping back: the worker's lookup names it instead
                settings[name] = os.path.realpath(expanded_path(settings[name], f"${name}"))
            except CorpusError as exc:  # ~user naming no user: one line, before any run starts
                raise FwbenchError(str(exc)) from None
    return settings


def apply_run_settings(settings: dict[str, str]) -> None:
    """Set the variables of :func:`run_settings` (from the process that launched the run) here, and
    remove each :data:`SWITCH_ENV` variable that ``settings`` lacks: a cluster started with
    ``FWBENCH_MALLOC_TUNING=0`` in its environment ran a driver's runs untuned when the driver asked for
    the default. (The data and cache directories of the worker's own environment are kept where the
    driver has none: a corpus found there is verified by its checksum.)

    Raises:
        FwbenchError: a name that is not one of :data:`RUN_SETTINGS_ENV`.
    """
    unknown = sorted(set(settings) - set(RUN_SETTINGS_ENV))
    if unknown:
        raise FwbenchError(f"settings: got {unknown[0]!r}; expected names among {', '.join(RUN_SETTINGS_ENV)}")
    for name in SWITCH_ENV:
        if name not in settings:
            os.environ.pop(name, None)
    os.environ.update(settings)


def use_data_dir(data_dir: str | Path | None) -> None:
    """Make ``--data-dir`` the data directory of this process and of every run it starts: tasks read
    it from ``$FWBENCH_DATA_DIR``, which subprocesses inherit and Ray workers receive with
    :func:`run_settings`. ``None`` leaves the environment as it is.

    Raises:
        FwbenchError: ``data_dir`` is empty (``Path("")`` is the working directory) or not a directory; without
            ``data_dir``, a ``$FWBENCH_DATA_DIR`` naming something that is there but is not a directory (a file: the
            local launcher stopped at its first LM run, ``--jobs 2`` recorded every LM run failed and exited 0).
    """
    if data_dir is None:
        try:
            data_dir_candidates(None)
        except CorpusError as exc:
            raise FwbenchError(str(exc)) from None
        return
    refuse_empty_path("--data-dir", data_dir, "a directory holding the data")
    try:
        is_dir = Path(data_dir).is_dir()
    except OSError as exc:  # a name of 300 characters: a bare 'File name too long' traceback
        raise FwbenchError(f"--data-dir: got {str(data_dir)!r}, which cannot be read ({exc.strerror or exc})") from None
    if not is_dir:
        raise FwbenchError(f"--data-dir: got {str(data_dir)!r}, which is not a directory")
    os.environ[DATA_DIR_ENV] = str(Path(data_dir).resolve())


#: The most torch threads a command accepts: far above any CPU's cores, far below what crashes the
#: process (``torch.set_num_threads(100000)`` then a matmul: a segmentation fault; 16384: libgomp's
#: "Thread creation failed" on a 2-core machine).
MAX_TORCH_THREADS = 1024


def set_torch_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)`` for a command's ``--threads``.

    Raises:
        FwbenchError: ``threads`` is not an integer in [1, :data:`MAX_TORCH_THREADS`].
    """
    if threads < 1:
        raise FwbenchError(f"--threads: got {threads}; expected a positive integer")
    if threads > MAX_TORCH_THREADS:
        raise FwbenchError(f"--threads: got {threads}; expected at most {MAX_TORCH_THREADS} (torch threads of one "
                           "process; far more crash it in OpenMP's thread creation)")
    torch.set_num_threads(threads)


def _is_index(text: str) -> bool:
    """Whether ``text`` is a device index torch reads: ASCII digits only (str.isdigit() admits
    '²', which int() refuses: ``--device cuda:²`` raised a ValueError traceback on a CUDA machine and
    reached every Ray worker as a device that cannot exist), without a leading zero (``torch.device``
    refuses ``cuda:01``: "RuntimeError: Invalid device string")."""
    return text.isascii() and text.isdigit() and (text == "0" or not text.startswith("0"))


def check_device_name(device: str) -> str:
    """Validate a device name without needing the device here (Ray workers resolve it remotely).

    Raises:
        FwbenchError: not one of auto, cpu, cuda, cuda:N.
    """
    index = device.partition(":")[2] if device.startswith("cuda:") else ""
    if device in DEVICE_CHOICES or (device.startswith("cuda:") and _is_index(index)):
        return device
    raise FwbenchError(f"--device: got {device!r}; expected one of auto, cpu, cuda, cuda:N")


def resolve_device(device: str) -> torch.device:
    """``auto`` → cuda when available, else cpu; ``cpu``; ``cuda`` or ``cuda:N``.

    Raises:
        FwbenchError: an unknown device name, or CUDA asked for where none is available.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise FwbenchError(
                f"--device: got {device!r}, but torch {torch.__version__} sees no CUDA device here; "
                "use --device cpu (or auto)"
            )
        index = device.partition(":")[2]
        # "cuda:" (an empty index) is no device torch reads: it raised "Invalid device string"
        if device != "cuda" and (not _is_index(index) or int(index) >= torch.cuda.device_count()):
            raise FwbenchError(f"--device: got {device!r}; expected cuda:N with N < {torch.cuda.device_count()}")
        return torch.device(device)
    raise FwbenchError(f"--device: got {device!r}; expected one of auto, cpu, cuda, cuda:N")


def git_commit() -> str | None:
    """The commit of the checkout fwbench runs from, or ``None`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


#: Linux's description of the CPUs (absent on macOS and Windows).
CPUINFO_PATH = Path("/proc/cpuinfo")
#: The /proc/cpuinfo fields that name a CPU model, the first present: x86's and 32-bit ARM's "model name",
#: MIPS's "cpu model", POWER's "cpu" ("POWER9 (architected), altivec supported"), RISC-V's "uarch".
_MODEL_FIELDS = ("model name", "cpu model", "cpu", "uarch")
#: The /proc/cpuinfo fields that name a CPU's microarchitecture, in the order shown: x86's family and
#: model, ARM's implementer, part and variant (ARM has no "model name": every ARM CPU is "aarch64"),
#: RISC-V's vendor, architecture and implementation ids, IBM Z's machine type (from its
#: "processor 0: ..., machine = 8561" line).
_MICROARCHITECTURE_FIELDS = (("cpu family", "family"), ("model", "model"),
                             ("CPU implementer", "implementer"), ("CPU part", "part"), ("CPU variant", "variant"),
                             ("mvendorid", "mvendorid"), ("marchid", "marchid"), ("mimpid", "mimpid"),
                             ("machine type", "machine"))


def _read_cpuinfo() -> str:
    """The text of :data:`CPUINFO_PATH`; '' where it cannot be read. Bytes that are not UTF-8 are replaced:
    they raised UnicodeDecodeError (not an OSError) out of every record's :func:`describe_environment`."""
    try:
        return CPUINFO_PATH.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


#: The ARM fields that differ between the cores of one big.LITTLE CPU (a Cortex-A55 beside an A76): each
#: value of every processor is kept, "0xd05/0xd0b"; the first processor's alone named two SoCs with the
#: same little cores and other big ones alike.
_PER_CORE_FIELDS = ("CPU implementer", "CPU part", "CPU variant")


def _cpuinfo_fields(cpuinfo: str) -> dict[str, str]:
    """Field → value of the first processor that has the field (the first value of each name); the
    :data:`_PER_CORE_FIELDS` → each distinct value, in the order the processors give them, joined by "/"."""
    fields: dict[str, str] = {}
    per_core: dict[str, list[str]] = {}
    # only "\n" ends a line of /proc/cpuinfo: splitlines() also split at "\x0b", "\x1c" and U+2028 inside
    # a value, and a model name holding one was cut there (the part after it a field of its own)
    for line in cpuinfo.split("\n"):
        key, colon, value = line.removesuffix("\r").partition(":")
        if colon and key.strip() in _PER_CORE_FIELDS and value.strip():
            seen = per_core.setdefault(key.strip(), [])
            seen += [value.strip()] if value.strip() not in seen else []
        if colon and key.strip() not in fields:
            fields[key.strip()] = value.strip()
        machine = re.search(r"\bmachine\s*=\s*(\w+)", value) if key.startswith("processor ") else None
        if machine and "machine type" not in fields:  # IBM Z: "processor 0: version = FF, ..., machine = 8561"
            fields["machine type"] = machine.group(1)
    return fields | {key: "/".join(values) for key, values in per_core.items()}


#: Where macOS keeps sysctl, tried before a ``sysctl`` on ``$PATH``: /usr/sbin is on the PATH of a login
#: shell, not on that of ``env -i`` (Python then searches /bin:/usr/bin), a pure nix shell or a minimal CI
#: job, where the same Mac was named "arm": one CPU, two identities, and every Mac's baseline judged as its own.
MACOS_SYSCTL = "/usr/sbin/sysctl"


def _platform_model() -> str:
    """The CPU's name where /proc/cpuinfo names none: macOS's brand string ("Apple M2 Pro", from
    :data:`MACOS_SYSCTL` else a ``sysctl`` on ``$PATH``; what :mod:`platform` says there is "arm" or "i386",
    the same for every Mac of a kind), else ``platform.processor()`` (Windows: "Intel64 Family 6 Model 85
    Stepping 7, GenuineIntel"), else ``platform.machine()``."""
    if platform.system() == "Darwin":
        for sysctl in (MACOS_SYSCTL, "sysctl"):
            try:
                # bytes that are not UTF-8 replaced, as in /proc/cpuinfo: text=True decoded strictly, and a
                # UnicodeDecodeError (no OSError) came out of every record's describe_environment
                out = subprocess.run([sysctl, "-n", "machdep.cpu.brand_string"], capture_output=True,
                                     encoding="utf-8", errors="replace", timeout=5, check=False)
            except (OSError, subprocess.SubprocessError):
                continue
            if out.returncode == 0 and _one_line(out.stdout):
                return _one_line(out.stdout)
    return _one_line(platform.processor()) or platform.machine()


def _one_line(name: str) -> str:
    """``name`` as one printable line, stripped: each character that is not printable (a newline, a tab, an
    escape) a space; a printable name, its spaces included, as it is. A brand string holding a newline
    (sysctl prints what it holds) made a CPU identity of two lines, which split the gate's one-line
    warnings and the report's header."""
    return "".join(c if c.isprintable() else " " for c in name).strip()


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name ("Intel(R) Xeon(R) Processor"; Linux's /proc/cpuinfo, :data:`_MODEL_FIELDS`),
    else :func:`_platform_model` ("Apple M2 Pro" on macOS; "aarch64" on Linux ARM).

    Args:
        cpuinfo: the text of /proc/cpuinfo (default: read it; '' where it cannot be read).
    """
    fields = _cpuinfo_fields(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    return next((_one_line(fields[key]) for key in _MODEL_FIELDS if _one_line(fields.get(key) or "")), None) \
        or _platform_model()


def cpu_identity(cpuinfo: str | None = None, capability: str | None = None) -> str:
    """The CPU as the performance gate keys its baselines: :func:`cpu_model` with the microarchitecture
    /proc/cpuinfo gives (x86: family and model; ARM: implementer, part and variant of each kind of core; RISC-V: its ids;
    IBM Z: the machine type) and the instruction set torch's kernels dispatch to
    (``torch.backends.cpu.get_cpu_capability()``, which follows ``ATEN_CPU_CAPABILITY``), e.g.
    ``"AMD EPYC [family 25, model 17, AVX512]"``.

    Why not the model name alone: a VM's is generic ("AMD EPYC", "Intel(R) Xeon(R) Processor"), the
    same for CPU generations whose balance of matmul and memory speed differs, and the gate's ratios
    move with that balance: on an AMD EPYC of family 25 model 17, the code of the very commit that
    measured perf_baseline-amd-epyc.json (on another "AMD EPYC") read 1.05-1.48x its ratios, within
    0.02 of the gate's 1.5 on an unchanged checkout. Where /proc/cpuinfo has no "model name" the name
    comes from the field the platform has (POWER's "cpu", macOS's brand string): each Mac was "arm",
    each POWER "ppc64le", so an M1's baseline was judged as an M3's own.

    Args:
        cpuinfo: the text of /proc/cpuinfo (default: read it; '' where it cannot be read).
        capability: torch's CPU capability (default: the running torch's).
    """
    cpuinfo = _read_cpuinfo() if cpuinfo is None else cpuinfo
    fields = _cpuinfo_fields(cpuinfo)
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    parts = [f"{shown} {fields[key]}" for key, shown in _MICROARCHITECTURE_FIELDS if fields.get(key)]
    return f"{cpu_model(cpuinfo)} [{', '.join([*parts, capability])}]"


def describe_environment(device: torch.device) -> dict:
    """Library versions, device name and thread count, stored in every record; ``denormals_flushed``:
    whether all of a CPU run's work flushed denormal floats to zero (one torch thread on a CPU that can)."""
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "threads": torch.get_num_threads(),
        "malloc_tuning": malloc_tuning_active(),
        # see fit(); set on the calling thread only: with more torch threads, the others compute with
        # denormals (2 threads: half of a large product kept them), so the record says false then
        "denormals_flushed": device.type == "cpu" and torch.get_num_threads() == 1 and denormal_flushing_supported(),
        "git_commit": git_commit(),
        "argv": portable_argv(sys.argv[1:]),
    }
    return info


def denormal_flushing_supported() -> bool:
    """Whether this CPU can flush denormal floats to zero (x86 with SSE3): the training loops then do
    (:func:`variants.kernels.precision.denormals_flushed`); the mode is left as it was."""
    with denormals_flushed():
        return denormals_are_flushed()


def portable_argv(argv: list[str]) -> list[str]:
    """``argv`` with each absolute path under the working directory written relative to it, and
    one under the home directory as ``~/…``: a record is shared, and this machine's paths mean
    nothing elsewhere. A path given as an option's value after ``=`` (``--results-dir=/abs/…``)
    likewise. Other arguments are kept as given."""
    cwd, home = Path.cwd(), Path.home()

    def portable(arg: str) -> str:
        path = Path(arg)
        if path.is_absolute() and path.is_relative_to(cwd):
            return str(path.relative_to(cwd)) or "."
        if path.is_absolute() and path.is_relative_to(home):
            return str(Path("~") / path.relative_to(home))
        return arg

    out = []
    for arg in argv:
        option, equals, value = arg.partition("=")
        out.append(f"{option}={portable(value)}" if option.startswith("-") and equals else portable(arg))
    return out
