"""Hugging Face Hub models (hf.co/OWNER/REPO:TAG): names, the choice of a file, and pulls
from a local fake Hub whose downloads redirect to a second, "storage" server."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pyengine import hub, store
from pyengine.errors import ModelNotFoundError, StoreError

SYNTH = Path(__file__).parent / "data" / "synth"


class _Server:
    """A ThreadingHTTPServer on a free port whose GETs go to ``route(handler)``."""

    def __init__(self, route) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                route(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _send(handler, status: int, body: bytes = b"", headers: dict | None = None) -> None:
    handler.send_response(status)
    for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


class FakeHub:
    """``/api/models/O/R/tree/main`` (paged by ``page_size``) and ``/O/R/resolve/main/PATH``,
    which redirects to the storage server.  Records each request and its Authorization."""

    def __init__(self) -> None:
        self.repos: dict[str, list[dict]] = {}
        self.blobs: dict[str, bytes] = {}          # sha256 -> bytes, on the storage server
        self.gated: set[str] = set()
        self.page_size = 1000
        self.requests: Counter[str] = Counter()
        self.auth: dict[str, list[str | None]] = {"hub": [], "storage": []}
        self.hub = _Server(self._route_hub)
        self.storage = _Server(self._route_storage)
        self.url = self.hub.url.replace("127.0.0.1", "localhost")   # a host apart from storage's

    def close(self) -> None:
        self.hub.close()
        self.storage.close()

    def add(self, repo: str, path: str, data: bytes, *, sha256: str | None = None, lfs: bool = True) -> None:
        digest = hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        entry = {"type": "file", "path": path, "size": len(data), "oid": "0" * 40}
        if lfs:
            entry["lfs"] = {"oid": sha256 or digest, "size": len(data), "pointerSize": 134}
        self.repos.setdefault(repo, []).append(entry)

    def _route_hub(self, handler) -> None:
        self.auth["hub"].append(handler.headers.get("Authorization"))
        url = urllib.parse.urlsplit(handler.path)
        self.requests[url.path] += 1
        parts = url.path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and parts[4:6] == ["tree", "main"]:
            self._tree(handler, "/".join(parts[2:4]), int(urllib.parse.parse_qs(url.query).get("page", ["0"])[0]))
        elif len(parts) > 4 and parts[2:4] == ["resolve", "main"]:
            self._resolve(handler, "/".join(parts[:2]), urllib.parse.unquote("/".join(parts[4:])))
        else:
            _send(handler, 404)

    def _tree(self, handler, repo: str, page: int) -> None:
        if repo not in self.repos:
            return _send(handler, 404)
        if repo in self.gated and handler.headers.get("Authorization") != "Bearer sesame":
            return _send(handler, 401)
        entries = self.repos[repo][page * self.page_size:(page + 1) * self.page_size]
        headers = {"Content-Type": "application/json"}
        if (page + 1) * self.page_size < len(self.repos[repo]):
            headers["Link"] = f'</api/models/{repo}/tree/main?recursive=true&page={page + 1}>; rel="next"'
        _send(handler, 200, json.dumps(entries).encode(), headers)

    def _resolve(self, handler, repo: str, path: str) -> None:
        entry = next((e for e in self.repos.get(repo, []) if e["path"] == path), None)
        if entry is None:
            return _send(handler, 404)
        digest = hashlib.sha256(self._blob_for(entry)).hexdigest()
        _send(handler, 302, headers={"Location": f"{self.storage.url}/blob/{digest}?signature=x"})

    def _blob_for(self, entry: dict) -> bytes:
        return next(b for b in self.blobs.values() if len(b) == entry["size"])

    def _route_storage(self, handler) -> None:
        self.auth["storage"].append(handler.headers.get("Authorization"))
        digest = urllib.parse.urlsplit(handler.path).path.rsplit("/", 1)[-1]
        self.requests["storage"] += 1
        if digest not in self.blobs:
            return _send(handler, 404)
        _send(handler, 200, self.blobs[digest])


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A fake Hub in HF_ENDPOINT and an empty store in PYENGINE_HOME."""
    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("PYENGINE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    yield server
    server.close()


def _entry(path: str, size: int = 10, sha: str = "a" * 64) -> dict:
    return {"type": "file", "path": path, "size": size, "lfs": {"oid": sha, "size": size}}


# ---- names -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "name"), [
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF", "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF"),
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:q4_k_m", "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"),
    ("huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0", "hf.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0"),
    ("HF.CO/unsloth/gemma-3-1b-it-GGUF:latest", "hf.co/unsloth/gemma-3-1b-it-GGUF"),
])
def test_hub_names_are_canonical(text: str, name: str) -> None:
    assert hub.parse(text).name == name
    assert store.canonical_name(text) == name


@pytest.mark.parametrize("text", [
    "hf.co/owner", "hf.co/owner/repo/extra", "hf.co/../repo", "hf.co/owner/re..po",
    "hf.co/owner/repo:Q4..0", "hf.co/owner/model.gguf", "hf.co/-owner/repo", "hf.co/owner/repo:",
    "example.com/owner/repo", "hf.co/owner/repo:tag:more",
])
def test_what_is_no_hub_name(text: str) -> None:
    assert hub.parse(text) is None
    if "/" in text:
        with pytest.raises(ModelNotFoundError):
            store.canonical_name(text)


@pytest.mark.parametrize(("path", "tag"), [
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    ("sub/qwen2.5-0.5b-instruct-iq4_xs.gguf", "IQ4_XS"),
    ("model-Q8_0-00001-of-00002.gguf", "Q8_0"),
    ("model.gguf", "MODEL"),
])
def test_file_tags(path: str, tag: str) -> None:
    assert hub.file_tag(path) == tag


# ---- choosing a file -----------------------------------------------------------------------


REPO = [_entry("m-Q4_K_S.gguf"), _entry("m-Q4_K_M.gguf"), _entry("m-Q8_0.gguf"),
        _entry("mmproj-m-f16.gguf"), _entry("README.md"), {"type": "directory", "path": "imatrix"}]


def test_choice_by_tag_and_by_default() -> None:
    ref = hub.parse("hf.co/o/m")
    assert hub.choose(ref, REPO).path == "m-Q4_K_M.gguf"
    chosen = hub.choose(ref.with_tag("Q4_K_S"), REPO)
    assert (chosen.path, chosen.tag, chosen.size, chosen.sha256) == ("m-Q4_K_S.gguf", "Q4_K_S", 10, "a" * 64)
    assert chosen.url.endswith("/o/m/resolve/main/m-Q4_K_S.gguf")
    # Q4_K does not take Q4_K_M or Q4_K_S: a tag is a whole part of the name
    with pytest.raises(StoreError, match="no Q4_K file.*hf.co/o/m:Q4_K_M, hf.co/o/m:Q4_K_S, hf.co/o/m:Q8_0"):
        hub.choose(ref.with_tag("Q4_K"), REPO)


def test_choice_without_a_default() -> None:
    ref = hub.parse("hf.co/o/m")
    assert hub.choose(ref, [_entry("x/m-BF16.gguf"), _entry("mmproj.gguf")]).tag == "BF16"
    with pytest.raises(StoreError, match="no Q4_K_M file, nor a single quantization.*:BF16.*:Q8_0"):
        hub.choose(ref, [_entry("m-BF16.gguf"), _entry("m-Q8_0.gguf")])
    with pytest.raises(StoreError, match="no Q4_K_M file"):   # a name no tag can hold
        hub.choose(ref, [_entry("m-weird+name.gguf")])


@pytest.mark.parametrize(("entries", "message"), [
    ([_entry("README.md"), _entry("mmproj-Q4_K_M.gguf")], "no GGUF model files"),
    ([_entry("m-Q4_K_M-00001-of-00002.gguf"), _entry("m-Q4_K_M-00002-of-00002.gguf")], "split into 2 files"),
    ([_entry("a/m-Q4_K_M.gguf"), _entry("b/m-Q4_K_M.gguf")], "matches several files"),
    ([{"type": "file", "path": "m-Q4_K_M.gguf", "size": 10}], "no sha256"),
    ([_entry("m-Q4_K_M.gguf", sha="xyz")], "no sha256"),
    ([_entry("m-Q4_K_M.gguf", size=0)], "no size"),
    ([_entry("../m-Q4_K_M.gguf")], "unsafe file name"),
])
def test_choice_refuses(entries: list[dict], message: str) -> None:
    with pytest.raises(StoreError, match=message):
        hub.choose(hub.parse("hf.co/o/m"), entries)


# ---- pulls -----------------------------------------------------------------------------------


def test_pull_verifies_stores_lists_and_removes(fake_hub) -> None:
    data = (SYNTH / "llama-spm-q4_0.gguf").read_bytes()
    fake_hub.add("o/tiny-GGUF", "tiny-Q4_0.gguf", data)
    fake_hub.add("o/tiny-GGUF", "tiny-Q8_0.gguf", b"other model")
    statuses = []
    path = store.pull("hf.co/o/tiny-GGUF:q4_0", progress=False,
                      callback=lambda status, done, total: statuses.append(status))
    assert path == store.cache_dir() / "models" / "hf.co" / "o" / "tiny-GGUF" / "Q4_0.gguf"
    assert path.read_bytes() == data
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "pulling hf.co/o/tiny-GGUF:Q4_0" in statuses
    assert fake_hub.requests["storage"] == 1
    # stored: no second download, and every lookup finds it
    assert store.pull("hf.co/o/tiny-GGUF:Q4_0", progress=False) == path
    assert fake_hub.requests["storage"] == 1
    assert store.find_local("huggingface.co/o/tiny-GGUF:Q4_0") == path
    assert store.resolve_model("hf.co/o/tiny-GGUF:Q4_0", pull=False) == path
    assert [(m.name, m.size_bytes) for m in store.list_models()] == [("hf.co/o/tiny-GGUF:Q4_0", len(data))]
    assert store.pullable("hf.co/o/tiny-GGUF") and not store.pullable("no-such-model")
    # no Q4_K_M and two quantizations: the name without a tag is not one of them
    assert store.find_local("hf.co/o/tiny-GGUF") is None
    assert store.remove("hf.co/o/tiny-GGUF:Q4_0")
    assert not store.remove("hf.co/o/tiny-GGUF:Q4_0")
    assert not (store.cache_dir() / "models" / "hf.co" / "o").exists()
    assert store.list_models() == []


def test_a_name_without_tag_is_remembered_offline(fake_hub, monkeypatch) -> None:
    fake_hub.add("o/one-GGUF", "one-Q6_K.gguf", b"only quantization")
    path = store.resolve_model("hf.co/o/one-GGUF", progress=False)
    assert path.name == "Q6_K.gguf" and path.read_bytes() == b"only quantization"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # the Hub is gone
    assert store.resolve_model("hf.co/o/one-GGUF:latest") == path
    assert store.find_local("hf.co/o/one-GGUF:Q6_K") == path
    assert [m.name for m in store.list_models()] == ["hf.co/o/one-GGUF:Q6_K"]
    assert store.remove("hf.co/o/one-GGUF")
    assert not (store.cache_dir() / "models" / "hf.co").joinpath("o", "one-GGUF").exists()
    with pytest.raises(StoreError, match="network error listing o/one-GGUF"):
        store.resolve_model("hf.co/o/one-GGUF")
    with pytest.raises(ModelNotFoundError, match="pyengine pull hf.co/o/one-GGUF"):
        store.resolve_model("hf.co/o/one-GGUF", pull=False)


def test_a_corrupt_download_is_not_stored(fake_hub) -> None:
    fake_hub.add("o/bad-GGUF", "bad-Q4_0.gguf", b"the bytes the Hub sends", sha256="b" * 64)
    with pytest.raises(StoreError, match="sha256 mismatch for bad-Q4_0.gguf"):
        store.pull("hf.co/o/bad-GGUF:Q4_0", progress=False)
    assert store.find_local("hf.co/o/bad-GGUF:Q4_0") is None
    assert not list((store.cache_dir() / "tmp").iterdir())


def test_the_token_goes_to_the_hub_only(fake_hub, monkeypatch) -> None:
    fake_hub.add("o/gated-GGUF", "g-Q4_0.gguf", b"gated weights")
    fake_hub.gated.add("o/gated-GGUF")
    with pytest.raises(StoreError, match="gated or private.*set HF_TOKEN"):
        store.pull("hf.co/o/gated-GGUF:Q4_0", progress=False)
    monkeypatch.setenv("HF_TOKEN", "wrong")
    with pytest.raises(StoreError, match="HF_TOKEN may not read it"):
        store.pull("hf.co/o/gated-GGUF:Q4_0", progress=False)
    monkeypatch.setenv("HF_TOKEN", "sesame")
    fake_hub.auth = {"hub": [], "storage": []}
    assert store.pull("hf.co/o/gated-GGUF:Q4_0", progress=False).read_bytes() == b"gated weights"
    assert fake_hub.auth["hub"] == ["Bearer sesame", "Bearer sesame"]   # the listing, the resolve
    assert fake_hub.auth["storage"] == [None]


def test_long_listings_are_paged(fake_hub) -> None:
    for i in range(5):
        fake_hub.add("o/many-GGUF", f"notes-{i}.txt", b"x" * (i + 1), lfs=False)
    fake_hub.add("o/many-GGUF", "many-Q4_K_M.gguf", b"the model")
    fake_hub.page_size = 2
    assert store.pull("hf.co/o/many-GGUF", progress=False).read_bytes() == b"the model"
    assert fake_hub.requests["/api/models/o/many-GGUF/tree/main"] == 3


@pytest.mark.parametrize(("name", "message"), [
    ("hf.co/o/absent", "no repository o/absent"),
    ("hf.co/o/m:Q2_K", "no Q2_K file"),
])
def test_pull_errors(fake_hub, name: str, message: str) -> None:
    fake_hub.add("o/m", "m-Q4_0.gguf", b"weights")
    with pytest.raises(StoreError, match=message):
        store.pull(name, progress=False)


def test_a_hub_model_loads_and_generates(fake_hub) -> None:
    from pyengine import LLM

    fake_hub.add("o/llama-GGUF", "llama-spm-Q4_0.gguf", (SYNTH / "llama-spm-q4_0.gguf").read_bytes())
    llm = LLM("hf.co/o/llama-GGUF:Q4_0", n_ctx=64, n_threads=1)
    try:
        assert llm.path == store.find_local("hf.co/o/llama-GGUF:Q4_0")
        reference = LLM(str(SYNTH / "llama-spm-q4_0.gguf"), n_ctx=64, n_threads=1)
        try:
            ids = llm.tokenize("hello world")
            assert llm.generate(ids, max_tokens=5, temperature=0) == reference.generate(ids, max_tokens=5, temperature=0)
        finally:
            reference.close()
    finally:
        llm.close()


def test_the_server_pulls_serves_and_deletes_a_hub_model(fake_hub) -> None:
    import httpx

    from pyengine.server import ServerConfig
    from server_support import running_server

    name = "hf.co/o/llama-GGUF:Q4_0"
    fake_hub.add("o/llama-GGUF", "llama-spm-Q4_0.gguf", (SYNTH / "llama-spm-q4_0.gguf").read_bytes())
    with running_server(ServerConfig(n_ctx=64)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        lines = [json.loads(line) for line in http.post("/api/pull", json={"model": name}).text.splitlines()]
        assert lines[0]["status"] == "pulling manifest" and lines[-1]["status"] == "success"
        assert [m["name"] for m in http.get("/api/tags").json()["models"]] == [name]
        reply = http.post("/api/generate", json={"model": "huggingface.co/o/llama-GGUF:q4_0", "prompt": "hello",
                                                  "stream": False, "options": {"num_predict": 3}})
        assert reply.status_code == 200, reply.text
        assert reply.json()["eval_count"] == 3
        assert http.request("DELETE", "/api/delete", json={"model": name}).status_code == 200
        assert http.get("/api/tags").json()["models"] == []


def test_pull_takes_the_repositorys_projector_beside_the_model(fake_hub) -> None:
    from pyengine.vision.files import projector_beside

    data = (SYNTH / "llama-spm-q4_0.gguf").read_bytes()
    fake_hub.add("o/seeing-GGUF", "seeing-Q4_0.gguf", data)
    fake_hub.add("o/seeing-GGUF", "mmproj-seeing-F32.gguf", b"the f32 projector")
    fake_hub.add("o/seeing-GGUF", "mmproj-seeing-F16.gguf", b"the f16 projector!")
    path = store.pull("hf.co/o/seeing-GGUF:Q4_0", progress=False)
    assert path.read_bytes() == data
    assert projector_beside(path).read_bytes() == b"the f16 projector!"
    assert [m.name for m in store.list_models()] == ["hf.co/o/seeing-GGUF:Q4_0"]   # no projector as a model
    assert store.remove("hf.co/o/seeing-GGUF:Q4_0")
    assert not (store.cache_dir() / "models" / "hf.co" / "o").exists()
