"""llama.cpp's tokenizer conformance suite, fetched once from its public source.

The suite (vocab-only GGUFs, with .inp/.out files for test-tokenizer-0) ships in the
llama-cpp-python sdist under vendor/llama.cpp/models/. It is downloaded through the
model store (hash-checked against the index and against the pin below), and its
ggml-vocab-* files are unpacked into <cache>/tokenizer-suite/<version>/.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tarfile
from pathlib import Path

from pyengine import store
from pyengine.tokenizer import Tokenizer

PROJECT = "llama-cpp-python"
VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_MEMBER_DIR = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/"
_SEPARATOR = "\n__ggml_vocab_test__\n"


def suite_dir() -> Path:
    """The unpacked suite (fetched and unpacked on first use)."""
    final = store.cache_dir() / "tokenizer-suite" / f"{PROJECT}-{VERSION}"
    if (final / ".complete").is_file():
        return final
    sdist = store.fetch_pypi_file(PROJECT, VERSION, sdist=True, progress=False)
    _check_sha256(sdist)
    temp = final.with_name(f".{final.name}.{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive.getmembers():
            name = member.name
            if not (member.isfile() and name.startswith(_MEMBER_DIR)):
                continue
            base = name[len(_MEMBER_DIR):]
            if "/" in base or not base.startswith("ggml-vocab-"):
                continue
            with archive.extractfile(member) as src, open(temp / base, "wb") as dst:
                shutil.copyfileobj(src, dst)
    (temp / ".complete").write_text(VERSION)
    try:
        temp.rename(final)
    except OSError:  # another process finished first
        shutil.rmtree(temp, ignore_errors=True)
    return final


def _check_sha256(path: Path) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != SHA256:
        raise AssertionError(f"{path} is not the pinned {PROJECT} {VERSION} sdist")


def vocab_files() -> list[Path]:
    """Every ggml-vocab-*.gguf of the suite."""
    return sorted(suite_dir().glob("ggml-vocab-*.gguf"))


def read_cases(vocab: Path) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs, read as test-tokenizer-0 reads them."""
    raw = Path(f"{vocab}.inp").read_text(encoding="utf-8")
    texts = raw.split(_SEPARATOR)
    if texts and texts[-1] == "":  # the file ends with a separator
        texts.pop()
    lines = Path(f"{vocab}.out").read_text(encoding="utf-8").splitlines()
    if len(texts) != len(lines):
        raise AssertionError(f"{vocab.name}: {len(texts)} inputs but {len(lines)} outputs")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


@functools.lru_cache(maxsize=None)
def tokenizer(name: str) -> Tokenizer:
    """The suite's ggml-vocab-<name>.gguf, loaded once per test session."""
    return Tokenizer.from_gguf(suite_dir() / f"ggml-vocab-{name}.gguf")
