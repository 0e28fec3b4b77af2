"""The Tiny Shakespeare loader: found through the setting, verified by checksum, downloaded safely.

No test touches the network: downloads are fakes or ``file://`` URLs, and a small fake corpus is
passed in with its own checksum. Tests that need the real corpus use ``FWBENCH_DATA_DIR`` (CI sets
it) and are skipped with the reason otherwise.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
from pathlib import Path

import pytest

from fwbench.cli import main
from fwbench.tasks import corpus as corpus_module
from fwbench.tasks.corpus import (
    CACHE_DIR_ENV,
    CORPUS_CHARACTERS,
    CORPUS_URL,
    DATA_DIR_ENV,
    CorpusError,
    locate_corpus,
    read_corpus,
)
from fwbench.tasks.shakespeare import CharCorpus

FAKE_TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 20
FAKE_SHA256 = hashlib.sha256(FAKE_TEXT.encode()).hexdigest()
#: Where the real corpus is, read before any test isolates the environment (CI sets it).
REAL_DATA_DIR = os.environ.get(DATA_DIR_ENV)


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path, monkeypatch):
    """Every test gets its own empty cache and no data directory from the environment."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(DATA_DIR_ENV, "")  # recorded, so that teardown also undoes `--data-dir` setting it
    monkeypatch.delenv(DATA_DIR_ENV)


def offline(url: str, destination: Path) -> None:
    raise urllib.error.URLError("network is unreachable")


def serve(text: str):
    """A fake download that writes ``text``."""
    def fetch(url: str, destination: Path) -> None:
        destination.write_text(text, encoding="utf-8")
    return fetch


def cached_file(tmp_path) -> Path:
    return tmp_path / "cache" / "tinyshakespeare" / "input.txt"


def test_found_through_the_environment_setting(tmp_path, monkeypatch):
    data = tmp_path / "data" / "tinyshakespeare"
    data.mkdir(parents=True)
    (data / "input.txt").write_text(FAKE_TEXT)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    assert locate_corpus(sha256=FAKE_SHA256, fetch=offline) == data / "input.txt"
    assert read_corpus(sha256=FAKE_SHA256, fetch=offline) == FAKE_TEXT


def test_found_as_input_txt_directly_in_the_given_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "elsewhere"))  # the argument wins over the variable
    (tmp_path / "input.txt").write_text(FAKE_TEXT)
    assert locate_corpus(tmp_path, sha256=FAKE_SHA256, fetch=offline) == tmp_path / "input.txt"


def test_checksum_mismatch_in_the_data_dir_is_one_clear_error(tmp_path):
    (tmp_path / "input.txt").write_text(FAKE_TEXT[:-10])
    with pytest.raises(CorpusError) as error:
        locate_corpus(tmp_path, sha256=FAKE_SHA256, fetch=serve(FAKE_TEXT))
    message = str(error.value)
    assert str(tmp_path / "input.txt") in message and FAKE_SHA256 in message and CORPUS_URL in message
    assert not cached_file(tmp_path).exists()  # a wrong local copy is reported, not silently bypassed


def test_missing_and_offline_names_the_places_the_setting_and_the_url(tmp_path):
    with pytest.raises(CorpusError) as error:
        locate_corpus(tmp_path / "empty", fetch=offline)
    message = str(error.value)
    for expected in ("--data-dir", DATA_DIR_ENV, CORPUS_URL, str(cached_file(tmp_path)),
                     str(tmp_path / "empty" / "tinyshakespeare" / "input.txt"), "network is unreachable"):
        assert expected in message
    assert "\n" not in message


def test_downloads_into_the_cache_and_then_reads_the_cache(tmp_path):
    calls = []

    def fetch(url, destination):
        calls.append(url)
        destination.write_text(FAKE_TEXT)

    assert locate_corpus(sha256=FAKE_SHA256, fetch=fetch) == cached_file(tmp_path)
    assert locate_corpus(sha256=FAKE_SHA256, fetch=offline) == cached_file(tmp_path)
    assert calls == [CORPUS_URL]
    assert cached_file(tmp_path).stat().st_mode & 0o777 == 0o644


def test_a_truncated_copy_left_in_the_cache_is_not_used(tmp_path):
    cached_file(tmp_path).parent.mkdir(parents=True)
    cached_file(tmp_path).write_text(FAKE_TEXT[: len(FAKE_TEXT) // 2])
    with pytest.raises(CorpusError, match="checksum mismatch"):
        locate_corpus(sha256=FAKE_SHA256, fetch=offline)
    # with the network back, the truncated copy is replaced by a verified one
    path = locate_corpus(sha256=FAKE_SHA256, fetch=serve(FAKE_TEXT))
    assert path == cached_file(tmp_path) and path.read_text() == FAKE_TEXT


def test_an_interrupted_download_leaves_nothing_in_the_cache(tmp_path):
    def dies_halfway(url, destination):
        destination.write_text(FAKE_TEXT[:100])
        raise ConnectionResetError("connection reset by peer")

    with pytest.raises(CorpusError, match="connection reset"):
        locate_corpus(sha256=FAKE_SHA256, fetch=dies_halfway)
    assert not cached_file(tmp_path).parent.exists()  # nor the directories made for it


def test_a_download_with_the_wrong_checksum_is_not_kept(tmp_path):
    with pytest.raises(CorpusError, match="truncated or altered"):
        locate_corpus(sha256=FAKE_SHA256, fetch=serve(FAKE_TEXT.upper()))
    assert not cached_file(tmp_path).parent.exists()


def test_default_fetch_downloads_a_file_url(tmp_path):
    source = tmp_path / "mirror.txt"
    source.write_text(FAKE_TEXT)
    path = locate_corpus(sha256=FAKE_SHA256, url=source.as_uri())
    assert path.read_text() == FAKE_TEXT


def test_character_vocabulary_and_90_10_split():
    corpus = CharCorpus.from_text("abcabcabcd")
    assert corpus.vocabulary == "abcd"
    assert corpus.train.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2] and corpus.valid.tolist() == [3]
    with pytest.raises(CorpusError, match="'z'"):
        corpus.encode("abz")


def test_cli_run_without_the_corpus_is_one_line_naming_the_setting(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(corpus_module, "urllib_fetch", offline)
    empty = tmp_path / "no-corpus-here"
    empty.mkdir()
    code = main(["run", "shakespeare", "--profile", "smoke", "--data-dir", str(empty),
                 "--results-dir", str(tmp_path / "results"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("fwbench: error: Tiny Shakespeare corpus not found")
    assert DATA_DIR_ENV in err and "--data-dir" in err and CORPUS_URL in err and "\n" not in err


def test_cli_data_dir_must_be_a_directory(tmp_path, capsys):
    assert main(["run", "shakespeare", "--profile", "smoke", "--data-dir", str(tmp_path / "missing")]) == 2
    assert "--data-dir" in capsys.readouterr().err


def real_data_dir() -> str:
    if not REAL_DATA_DIR:
        pytest.skip(f"the real corpus is not provided ({DATA_DIR_ENV} is unset; CI sets it)")
    return REAL_DATA_DIR


def test_real_corpus_has_the_documented_size_vocabulary_and_split(monkeypatch):
    directory = real_data_dir()
    text = read_corpus(directory, fetch=offline)
    assert len(text) == CORPUS_CHARACTERS
    corpus = CharCorpus.from_text(text)
    assert len(corpus.vocabulary) == 65
    assert corpus.train.numel() == int(0.9 * CORPUS_CHARACTERS)
    assert corpus.train.numel() + corpus.valid.numel() == CORPUS_CHARACTERS


def test_the_task_hashes_the_corpus_once_and_again_when_the_file_changes(tmp_path, monkeypatch):
    """Every training batch asks the task for its corpus: the checksum is not recomputed each time
    (a few ms per batch), but a file replaced in place is verified again."""
    from fwbench.tasks.shakespeare import ShakespeareTask

    data = tmp_path / "data"
    data.mkdir()
    (data / "input.txt").write_text(FAKE_TEXT)
    hashed = []
    real_sha256_of = corpus_module.sha256_of
    monkeypatch.setattr(corpus_module, "sha256_of", lambda path: hashed.append(path) or real_sha256_of(path))
    task = ShakespeareTask(data_dir=data, sha256=FAKE_SHA256, fetch=offline)
    for _ in range(5):
        assert task.corpus().train.numel() > 0
    assert len(hashed) == 1
    (data / "input.txt").write_text(FAKE_TEXT.replace("speak", "SPEAK"))  # same size, new content and mtime
    os.utime(data / "input.txt", ns=(1, 1))
    with pytest.raises(CorpusError, match="sha256"):
        task.corpus()
