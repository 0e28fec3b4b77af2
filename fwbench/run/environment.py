"""Where a run happens: device resolution and the facts every record carries for provenance."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import torch

from fwbench.errors import FwbenchError
from fwbench.run.allocator import malloc_tuning_active

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def check_device_name(device: str) -> str:
    """Validate a device name without needing the device here (Ray workers resolve it remotely).

    Raises:
        FwbenchError: not one of auto, cpu, cuda, cuda:N.
    """
    index = device.partition(":")[2] if device.startswith("cuda:") else ""
    if device in DEVICE_CHOICES or (device.startswith("cuda:") and index.isdigit()):
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
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
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


def describe_environment(device: torch.device) -> dict:
    """Library versions, device name and thread count, stored in every record."""
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
        ),
        "threads": torch.get_num_threads(),
        "malloc_tuning": malloc_tuning_active(),
        "git_commit": git_commit(),
        "argv": sys.argv[1:],
    }
    return info
