"""Locate, download and verify the Tiny Shakespeare corpus (Karpathy's char-rnn data).

Search order (the first verified copy wins):

1. the data directory given by the caller (``fwbench run --data-dir DIR``) or, failing that, the
   environment variable ``FWBENCH_DATA_DIR``: ``DIR/tinyshakespeare/input.txt`` or ``DIR/input.txt``;
2. the user cache: ``<cache>/tinyshakespeare/input.txt``, where ``<cache>`` is
   ``FWBENCH_CACHE_DIR`` if set, else the platform's user cache directory for fwbench
   (``~/.cache/fwbench`` on Linux);
3. a download from :data:`CORPUS_URL` into the cache.

Every copy is checked against :data:`CORPUS_SHA256` before use. A download goes to a temporary
file beside its destination and is renamed into place only after its checksum matches, so an
interrupted or corrupted download never sits in the cache as ``input.txt``; a wrong file already in
the cache (say, truncated by another tool) is ignored and replaced. When no verified copy can be
found or fetched, :class:`CorpusError` says where it looked, why each place failed, and how to
provide the file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

import platformdirs

CORPUS_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
CORPUS_CHARACTERS = 1_115_394
CORPUS_DIR = "tinyshakespeare"
CORPUS_FILE = "input.txt"
DATA_DIR_ENV = "FWBENCH_DATA_DIR"
CACHE_DIR_ENV = "FWBENCH_CACHE_DIR"
DOWNLOAD_TIMEOUT_S = 30.0

#: ``fetch(url, destination)`` writes the body of ``url`` to the file ``destination`` or raises.
Fetch = Callable[[str, Path], None]


class CorpusError(ValueError):
    """The corpus is missing, unreachable or fails its checksum; the message says how to fix it."""


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def expanded_path(value: str | Path, source: str) -> Path:
    """``value`` as a path, a leading ``~`` or ``~user`` expanded; ``source`` names where it came from
    (``$FWBENCH_CACHE_DIR``, ``--data-dir``) for the error.

    Raises:
        CorpusError: ``~user`` names no user of this machine (pathlib raised "RuntimeError: Could not
            determine home directory.", which named neither the variable nor its value).
    """
    try:
        return Path(value).expanduser()
    except RuntimeError:
        home = str(value).split("/", 1)[0]
        raise CorpusError(f"{source}: got {str(value)!r}; expected a directory path ({home!r} names no user's home "
                          "directory on this machine)") from None


def cache_dir() -> Path:
    """fwbench's user cache directory: ``FWBENCH_CACHE_DIR`` if set (``~`` expanded, as the data
    directory's is and as a Ray worker receives it), else the platform default.

    Raises:
        CorpusError: a ``~user`` naming no user (:func:`expanded_path`).
    """
    override = os.environ.get(CACHE_DIR_ENV)
    return expanded_path(override, f"${CACHE_DIR_ENV}") if override else Path(platformdirs.user_cache_dir("fwbench"))


def _not_a_folder(path: Path) -> bool:
    """Whether ``path`` names something that is there but cannot be a folder: a file, a FIFO, a device, a broken or
    looping link, a path through a file (``/etc/passwd/x``). ``False`` for a folder, a link to one, and a path that
    names nothing (searched, and reported absent) or that the OS refuses to look up (``_is_file`` names it)."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except FileNotFoundError:
        return os.path.lexists(path)  # a link to nothing
    except NotADirectoryError:
        return True
    except OSError as exc:
        return exc.errno == errno.ELOOP


def data_dir_candidates(data_dir: str | Path | None) -> list[Path]:
    """Files that may hold the corpus under ``data_dir`` (or ``FWBENCH_DATA_DIR``), in order.

    Raises:
        CorpusError: a ``~user`` naming no user (:func:`expanded_path`), or a path to something that is not a
            directory.
    """
    root = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    if not root:
        return []
    source = "--data-dir" if data_dir is not None else f"${DATA_DIR_ENV}"
    root = expanded_path(root, source)
    if _not_a_folder(root):  # FWBENCH_DATA_DIR=/etc/passwd was searched as a folder, "(absent)", then a download tried
        raise CorpusError(f"{source}: got {str(root)!r}, which is not a directory; expected a directory holding "
                          f"{CORPUS_DIR}/{CORPUS_FILE} or {CORPUS_FILE}")
    return [root / CORPUS_DIR / CORPUS_FILE, root / CORPUS_FILE]


def urllib_fetch(url: str, destination: Path) -> None:
    """Default :data:`Fetch`: stream ``url`` (http(s) or file://) into ``destination``."""
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(destination, "wb") as out:
        shutil.copyfileobj(response, out)


def download_verified(url: str, destination: Path, sha256: str, fetch: Fetch | None = None) -> None:
    """Fetch ``url`` to a temporary file beside ``destination``; rename it there only if it matches.

    Raises:
        CorpusError: the fetch failed (offline, HTTP error) or the body's checksum differs; the
            temporary file, and any directory made for it, is removed either way, so nothing
            partial is left behind.
    """
    fetch = fetch or urllib_fetch
    created = [d for d in (destination.parent, *destination.parent.parents) if not d.exists()]
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{destination.name}.", suffix=".part", dir=destination.parent)
    os.close(handle)
    temporary = Path(temporary)
    try:
        try:
            fetch(url, temporary)
        except Exception as exc:  # any transport failure means "not available"; the caller explains
            raise CorpusError(f"download from {url} failed: {type(exc).__name__}: {exc}") from exc
        got = sha256_of(temporary)
        if got != sha256:
            raise CorpusError(f"download from {url} has sha256 {got}, expected {sha256} (truncated or altered)")
        os.chmod(temporary, 0o644)  # mkstemp creates 0600; the cache is an ordinary user file
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)
        if not destination.exists():  # a failed download leaves no empty cache directories either
            for directory in created:  # deepest first
                with contextlib.suppress(OSError):  # not empty (another process wrote there): keep it
                    directory.rmdir()


def _is_file(path: Path, setting: str) -> bool:
    """``path.is_file()``, or a :class:`CorpusError` naming ``path`` and the ``setting`` that chose it: a folder name
    of 300 characters raised a bare ``OSError: [Errno 36] File name too long`` traceback (from every grid load
    that checks an LM grid against the corpus, and from ``fwbench run --data-dir``)."""
    try:
        return path.is_file()
    except OSError as exc:
        raise CorpusError(f"{setting}: cannot look for the corpus at {str(path)!r} ({exc.strerror or exc}); "
                          "expected a readable folder") from None


def _sha256(path: Path, setting: str) -> str:
    """:func:`sha256_of` ``path``, or a :class:`CorpusError` naming it (a file that cannot be read)."""
    try:
        return sha256_of(path)
    except OSError as exc:
        raise CorpusError(f"{setting}: cannot read {str(path)!r} ({exc.strerror or exc}); expected a readable "
                          "copy of the corpus") from None


def locate_corpus(data_dir: str | Path | None = None, *, sha256: str = CORPUS_SHA256, url: str = CORPUS_URL,
                  fetch: Fetch | None = None, download: bool = True) -> Path:
    """Path of a verified copy of the corpus, downloading it into the cache if needed.

    Args:
        data_dir: directory to search first; ``None`` reads ``FWBENCH_DATA_DIR``.
        sha256: expected checksum (tests pass the checksum of a small fake corpus).
        url: where to download from when no local copy verifies.
        fetch: how to download (default :func:`urllib_fetch`; tests pass a fake).
        download: ``False`` never touches the network.

    Raises:
        CorpusError: a copy in the data directory fails its checksum (it is never replaced), or
            no copy verifies and the download fails or is disabled. The message lists every place
            searched, the ``--data-dir`` flag, the ``FWBENCH_DATA_DIR`` variable and the URL.
    """
    looked: list[str] = []
    for candidate in data_dir_candidates(data_dir):
        if _is_file(candidate, "--data-dir or $" + DATA_DIR_ENV):
            got = _sha256(candidate, "--data-dir or $" + DATA_DIR_ENV)
            if got != sha256:
                raise CorpusError(
                    f"{candidate} has sha256 {got}, expected {sha256}: not the Tiny Shakespeare corpus or an "
                    f"incomplete copy; replace it with the file from {url}"
                )
            return candidate
        looked.append(f"{candidate} (absent)")
    cached = cache_dir() / CORPUS_DIR / CORPUS_FILE
    if _is_file(cached, "$" + CACHE_DIR_ENV):
        if _sha256(cached, "$" + CACHE_DIR_ENV) == sha256:
            return cached
        looked.append(f"{cached} (checksum mismatch, ignored and replaced on download)")
    else:
        looked.append(f"{cached} (absent)")
    reason = "downloads disabled"
    if download:
        try:
            download_verified(url, cached, sha256, fetch)
            return cached
        except (CorpusError, OSError) as exc:
            reason = str(exc)
    if not data_dir_candidates(data_dir):
        looked.insert(0, f"no data directory given (--data-dir or {DATA_DIR_ENV})")
    raise CorpusError(
        f"Tiny Shakespeare corpus not found. Looked in: {'; '.join(looked)}. Download: {reason}. "
        f"Provide it with `fwbench run --data-dir DIR` or {DATA_DIR_ENV}=DIR, where DIR/{CORPUS_DIR}/{CORPUS_FILE} "
        f"or DIR/{CORPUS_FILE} is the file from {url} (sha256 {sha256})."
    )


def read_corpus(data_dir: str | Path | None = None, **locate_options) -> str:
    """The corpus text (UTF-8) from :func:`locate_corpus`."""
    return locate_corpus(data_dir, **locate_options).read_text(encoding="utf-8")
