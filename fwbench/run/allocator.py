"""Keep freed CPU tensor memory in the process (glibc malloc), so training steps stop page-faulting.

By default glibc serves every allocation above 128 KiB-32 MiB (its adaptive mmap threshold) with a
fresh ``mmap`` and returns it to the kernel on ``free``; it also trims the heap top once 128 KiB of
it is free. A training step of the paper's models allocates and frees dozens of such tensors (a
(32, 1, 120, 128) fp32 activation is 2 MB), so each one is faulted in page by page, step after step:
on this project's 2-core VMs that cost about a third of a Setting 2 training step. Raising both
thresholds keeps the memory in malloc's free lists for reuse, the same effect as running PyTorch on
jemalloc or tcmalloc, which PyTorch's CPU performance guide recommends. Peak memory is unchanged
(the process already held it at its peak); only the return of freed memory to the kernel is
deferred to the end of the process.

Applied by the ``fwbench`` command at start-up. ``FWBENCH_MALLOC_TUNING=0`` switches it off (to
measure its effect, or where memory must go back to the system between runs). A no-op where the C
library is not glibc (macOS, musl) or the tuning is off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from fwbench.errors import FwbenchError

#: Environment variable that switches the tuning off when set to 0.
TUNING_ENV = "FWBENCH_MALLOC_TUNING"
#: mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Allocations up to this size come from the heap (glibc caps the value at HEAP_MAX/2 on 64-bit).
MMAP_THRESHOLD_BYTES = 1 << 30
#: Free memory at the heap top kept before trimming (the largest value mallopt accepts).
TRIM_THRESHOLD_BYTES = 2**31 - 1

#: Accepted spellings of the setting (case-insensitive).
ON, OFF = frozenset({"1", "on", "true", "yes"}), frozenset({"0", "off", "false", "no"})

_applied: bool | None = None


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; return whether the tuning is active.

    Returns False (and changes nothing) when ``FWBENCH_MALLOC_TUNING`` is 0 (or off, false, no), on a
    C library other than glibc, or if ``mallopt`` refuses a value.

    Raises:
        FwbenchError: ``FWBENCH_MALLOC_TUNING`` is set to something other than 1/on/true/yes or 0/off/false/no.
    """
    global _applied
    if _applied is not None:
        return _applied
    setting = os.environ.get(TUNING_ENV, "1").strip().lower()
    if setting not in ON | OFF:
        raise FwbenchError(f"${TUNING_ENV}: got {os.environ[TUNING_ENV]!r}; expected 1 (on, the default) or 0 (off)")
    _applied = False
    if setting in OFF or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    return _applied


def malloc_tuning_active() -> bool:
    """Whether :func:`tune_malloc` changed the allocator in this process (for run provenance)."""
    return bool(_applied)
