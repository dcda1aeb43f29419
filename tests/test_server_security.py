"""Safety and resource limits of the server: bind check, API key, CORS, host check,
bounded queue (503 + Retry-After), cancellation on disconnect, keep_alive, the model
store endpoints. Most use a fake model whose replies take a known time."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from pyengine import cli, store
from pyengine.errors import InvalidOptionError, StoreError
from pyengine.server import ServerConfig, check_bind, resolve_served
from server_support import FakeAdapter, fake_loader, running_server, wait_for

SYNTH_MODEL = Path(__file__).parent / "data" / "synth" / "llama-f16.gguf"
FAKE = "fake"
CHAT = {"model": FAKE, "messages": [{"role": "user", "content": "Hi"}]}


def fake_server(adapter: FakeAdapter, **config):
    config.setdefault("sweep_interval_s", 0.05)
    return running_server(ServerConfig(**config), loader=fake_loader(adapter), served={FAKE: SYNTH_MODEL})


# --------------------------------------------------------------------------------------
# Binding
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.5.0.1"])
def test_loopback_binds_need_no_key(host):
    check_bind(ServerConfig(host=host))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_open_binds_need_a_key_or_insecure(host):
    with pytest.raises(InvalidOptionError, match="API key"):
        check_bind(ServerConfig(host=host))
    check_bind(ServerConfig(host=host, api_key="k"))
    check_bind(ServerConfig(host=host, insecure=True))


def test_serve_command_checks_before_starting(capsys, monkeypatch):
    started = []
    monkeypatch.setattr("pyengine.server.app.serve", lambda config: started.append(config))
    monkeypatch.delenv("PYENGINE_API_KEY", raising=False)
    assert cli.main(["serve", "--host", "0.0.0.0"]) == 1
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err and started == []
    monkeypatch.setenv("PYENGINE_API_KEY", "from-env")
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "8080", "--parallel", "3", "--max-queue", "5",
                     "--cors-origin", "https://a.example", "--keep-alive", "10m", "--model", str(SYNTH_MODEL)]) == 0
    [config] = started
    assert (config.api_key, config.port, config.parallel, config.max_queue) == ("from-env", 8080, 3, 5)
    assert config.cors_origins == ("https://a.example",) and config.keep_alive_s == 600
    assert config.models == (str(SYNTH_MODEL),)
    assert cli.main(["serve", "--keep-alive", "soon"]) == 1
    assert "--keep-alive" in capsys.readouterr().err


def test_served_paths_and_names():
    served = resolve_served([str(SYNTH_MODEL)])
    assert served == {"llama-f16": SYNTH_MODEL.resolve()}
    with pytest.raises(Exception, match="no such model file"):
        resolve_served(["/nonexistent/model.gguf"])


# --------------------------------------------------------------------------------------
# API key, CORS, Host
# --------------------------------------------------------------------------------------


def test_api_key_is_required_when_set():
    with fake_server(FakeAdapter(pieces=2, delay_s=0), api_key="sekret") as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            missing = http.post("/api/chat", json=CHAT)
            assert missing.status_code == 401 and "API key" in missing.json()["error"]
            assert missing.headers["www-authenticate"] == "Bearer"
            wrong = http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
            assert http.get("/").status_code == 200  # the liveness probe stays open
            ok = http.post("/api/chat", json={**CHAT, "stream": False}, headers={"Authorization": "Bearer sekret"})
            assert ok.status_code == 200 and ok.json()["done"] is True
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sekret", max_retries=0)
        reply = client.chat.completions.create(model=FAKE, messages=CHAT["messages"])
        assert reply.choices[0].message.content == "w0 w1 "
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="bad", max_retries=0).models.list()
        assert ollama.Client(host=server.url, headers={"Authorization": "Bearer sekret"}).list().models
        with pytest.raises(ollama.ResponseError) as info:
            ollama.Client(host=server.url).list()
        assert info.value.status_code == 401


def test_cors_allows_loopback_and_listed_origins_only():
    with fake_server(FakeAdapter(), api_key="k", cors_origins=("https://app.example",)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "https://app.example"):
                preflight = http.options("/api/chat", headers={"Origin": origin,
                                                               "Access-Control-Request-Method": "POST",
                                                               "Access-Control-Request-Headers": "authorization"})
                assert preflight.status_code == 200, origin
                assert preflight.headers["access-control-allow-origin"] == origin
                assert "POST" in preflight.headers["access-control-allow-methods"]
            refused = http.options("/api/chat", headers={"Origin": "https://evil.example",
                                                         "Access-Control-Request-Method": "POST"})
            assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
            simple = http.get("/api/version", headers={"Origin": "https://evil.example", "Authorization": "Bearer k"})
            assert simple.status_code == 403 and "access-control-allow-origin" not in simple.headers
            simple = http.get("/api/version", headers={"Origin": "http://localhost", "Authorization": "Bearer k"})
            assert simple.headers["access-control-allow-origin"] == "http://localhost"


CROSS_SITE_POSTS = [
    ("/api/generate", {"model": FAKE, "prompt": "Hi"}),
    ("/api/chat", CHAT),
    ("/api/pull", {"model": "smollm2-135m"}),
    ("/api/delete", {"model": FAKE}),
    ("/v1/chat/completions", CHAT),
    ("/api/embed", {"model": FAKE, "input": "Hi"}),
]


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "https://127.0.0.1.evil.example",
                                    "http://localhost.evil.example:11434", "file://"])
def test_requests_from_foreign_pages_are_refused_before_anything_runs(origin, tmp_path, monkeypatch):
    monkeypatch.setenv("PYENGINE_HOME", str(tmp_path))
    adapter = FakeAdapter(pieces=2, delay_s=0)
    with fake_server(adapter) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for path, body in CROSS_SITE_POSTS:
                # text/plain is what a page sends without a preflight; the body is still JSON
                for content_type in ("text/plain", "application/json", None):
                    headers = {"Origin": origin}
                    if content_type:
                        headers["Content-Type"] = content_type
                    method = "DELETE" if path == "/api/delete" else "POST"
                    reply = http.request(method, path, content=json.dumps(body), headers=headers)
                    assert reply.status_code == 403, (path, content_type, reply.text)
                    assert "origin" in reply.text and "--allow-origin" in reply.text
            for path in ("/api/tags", "/api/ps", "/v1/models", "/api/version", "/"):
                assert http.get(path, headers={"Origin": origin}).status_code == 403, path
    assert adapter.runs == []
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())  # nothing pulled


def test_loopback_listed_and_same_origin_pages_are_served():
    adapter = FakeAdapter(pieces=2, delay_s=0)
    with fake_server(adapter, cors_origins=("https://app.example",)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for origin in ("http://localhost:5173", "http://127.0.0.1", "https://app.example",
                           f"http://127.0.0.1:{server.port}"):
                reply = http.post("/api/chat", json={**CHAT, "stream": False}, headers={"Origin": origin})
                assert reply.status_code == 200, (origin, reply.text)
    assert len(adapter.runs) == 4
    with fake_server(FakeAdapter(pieces=1, delay_s=0), cors_origins=("*",)) as server:
        reply = httpx.post(server.url + "/api/chat", json={**CHAT, "stream": False},
                           headers={"Origin": "https://anything.example"})
        assert reply.status_code == 200


def test_serve_takes_allow_origin(monkeypatch):
    started = []
    monkeypatch.setattr("pyengine.server.app.serve", lambda config: started.append(config))
    assert cli.main(["serve", "--allow-origin", "https://a.example", "https://b.example",
                     "--model", str(SYNTH_MODEL)]) == 0
    assert started[0].cors_origins == ("https://a.example", "https://b.example")


@pytest.mark.parametrize("content_type, origin, status", [
    ("application/json", None, 200),
    ("application/json; charset=utf-8", None, 200),
    ("application/vnd.api+json", None, 200),
    (None, None, 200),
    ("application/x-www-form-urlencoded", None, 200),   # curl -d
    ("application/x-www-form-urlencoded", "http://localhost:3000", 415),
    ("text/plain", None, 415),
    ("text/plain;charset=UTF-8", "http://localhost:3000", 415),
    ("multipart/form-data; boundary=x", None, 415),
    ("application/xml", None, 415),
])
def test_json_bodies_must_be_labelled_as_json(content_type, origin, status):
    with fake_server(FakeAdapter(pieces=1, delay_s=0)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            headers = {key: value for key, value in (("Content-Type", content_type), ("Origin", origin)) if value}
            for path in ("/api/chat", "/v1/chat/completions"):
                reply = http.post(path, content=json.dumps({**CHAT, "stream": False}), headers=headers)
                assert reply.status_code == status, (path, reply.text)
                if status == 415:
                    assert "application/json" in reply.text


def test_foreign_host_header_is_refused():
    with fake_server(FakeAdapter()) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            refused = http.get("/api/version", headers={"Host": "evil.example"})
            assert refused.status_code == 403 and "not allowed" in refused.json()["error"]
            assert http.get("/api/version", headers={"Host": f"localhost:{server.port}"}).status_code == 200


def test_body_limit_is_configurable():
    with fake_server(FakeAdapter(), max_body_bytes=1024) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            big = http.post("/v1/chat/completions", json={**CHAT, "pad": "x" * 2048})
            assert big.status_code == 413 and "1024 bytes" in big.json()["error"]["message"]
            assert http.post("/api/chat", json={**CHAT, "stream": False}).status_code == 200


# --------------------------------------------------------------------------------------
# Queue and cancellation
# --------------------------------------------------------------------------------------


def test_full_queue_answers_503_with_retry_after():
    adapter = FakeAdapter(pieces=40, delay_s=0.05)
    with fake_server(adapter, parallel=1, max_queue=1, retry_after_s=2) as server:
        state = server.state
        with httpx.Client(base_url=server.url, timeout=30) as http:
            streams = [http.stream("POST", "/api/chat", json=CHAT) for _ in range(2)]
            responses = [s.__enter__() for s in streams]
            assert wait_for(lambda: state.admission.in_flight == 2)
            busy = http.post("/api/chat", json=CHAT)
            assert busy.status_code == 503 and busy.headers["retry-after"] == "2"
            assert "busy" in busy.json()["error"]
            busy = http.post("/v1/chat/completions", json=CHAT)
            assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_overloaded"
            for response, stream in zip(responses, streams):
                lines = [json.loads(line) for line in response.iter_lines()]
                assert lines[-1]["done"] is True and len(lines) == 41
                stream.__exit__(None, None, None)
            assert wait_for(lambda: state.admission.in_flight == 0)
            assert http.post("/api/chat", json={**CHAT, "stream": False}).status_code == 200


def test_twenty_concurrent_streams_with_parallel_4_and_queue_8():
    adapter = FakeAdapter(pieces=30, delay_s=0.1)  # each reply takes 3 s
    with fake_server(adapter, parallel=4, max_queue=8) as server:
        statuses: list[tuple[int, bool]] = []
        barrier = threading.Barrier(20)

        def one() -> None:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                barrier.wait()
                with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
                    body = response.read().decode()
                    statuses.append((response.status_code, body.rstrip().endswith("data: [DONE]")))

        threads = [threading.Thread(target=one) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(statuses) == [(200, True)] * 12 + [(503, False)] * 8
        assert wait_for(lambda: server.state.admission.in_flight == 0)
        assert server.state.registry.get_loaded(FAKE).active == 0


def test_disconnect_cancels_a_stream():
    adapter = FakeAdapter(pieces=200, delay_s=0.05)
    with fake_server(adapter) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            with http.stream("POST", "/api/generate", json={"model": FAKE, "prompt": "Hi"}) as response:
                lines = response.iter_lines()
                assert json.loads(next(lines))["done"] is False
            [run] = adapter.runs
            assert wait_for(lambda: run.cancelled.is_set(), timeout=3)
            assert wait_for(lambda: server.state.admission.in_flight == 0)
            assert server.state.registry.get_loaded(FAKE).active == 0


def test_disconnect_cancels_a_whole_reply():
    adapter = FakeAdapter(pieces=200, delay_s=0.05)
    with fake_server(adapter) as server:
        with httpx.Client(base_url=server.url, timeout=0.5) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/chat/completions", json=CHAT)
        [run] = adapter.runs
        assert wait_for(lambda: run.cancelled.is_set(), timeout=3)
        assert wait_for(lambda: server.state.admission.in_flight == 0)


def test_errors_while_generating():
    adapter = FakeAdapter(pieces=3, delay_s=0, fail_with=InvalidOptionError("grammar dead end"))
    with fake_server(adapter) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            whole = http.post("/api/chat", json={**CHAT, "stream": False})
            assert whole.status_code == 400 and whole.json()["error"] == "grammar dead end"
            lines = http.post("/api/chat", json=CHAT).text.splitlines()
            assert json.loads(lines[0])["done"] is False
            assert json.loads(lines[-1]) == {"error": "grammar dead end"}
            events = http.post("/v1/chat/completions", json={**CHAT, "stream": True}).text.split("\n\n")
            assert "grammar dead end" in events[-3] and events[-2] == "data: [DONE]"
            assert wait_for(lambda: server.state.admission.in_flight == 0)


@pytest.fixture(scope="module")
def real_server(smollm2_path):
    with running_server(ServerConfig(n_ctx=2048)) as server:
        yield server


def test_disconnect_frees_the_real_model(real_server):
    with httpx.Client(base_url=real_server.url, timeout=120) as http:
        body = {"model": "smollm2-135m", "prompt": "Tell me a long story.", "options": {"num_predict": 1500}}
        with http.stream("POST", "/api/generate", json=body) as response:
            lines = response.iter_lines()
            for _ in range(3):
                assert json.loads(next(lines))["done"] is False
        started = time.monotonic()
        quick = http.post("/api/generate", json={"model": "smollm2-135m", "prompt": "Hi", "stream": False,
                                                 "options": {"num_predict": 2}})
        assert quick.status_code == 200 and quick.json()["eval_count"] == 2
        # Without the cancel this request would wait for ~1500 tokens of the dropped one.
        assert time.monotonic() - started < 20
        assert wait_for(lambda: real_server.state.admission.in_flight == 0)
        adapter = real_server.state.registry.get_loaded("smollm2-135m").adapter
        stats = adapter.llm.stats  # no sequence left holding cache cells
        assert wait_for(lambda: stats()["live"] == 0 and stats()["cells_live"] == 0)


# --------------------------------------------------------------------------------------
# keep_alive and loading
# --------------------------------------------------------------------------------------


def test_keep_alive_zero_unloads_after_the_request():
    adapter = FakeAdapter(pieces=1, delay_s=0)
    with fake_server(adapter) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            reply = http.post("/api/chat", json={**CHAT, "stream": False, "keep_alive": 0})
            assert reply.status_code == 200
            assert wait_for(lambda: adapter.closed)
            assert http.get("/api/ps").json() == {"models": []}


def test_keep_alive_expiry_and_forever():
    adapter = FakeAdapter(pieces=1, delay_s=0)
    with fake_server(adapter) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            http.post("/api/chat", json={**CHAT, "stream": False, "keep_alive": -1})
            time.sleep(0.3)
            [model] = http.get("/api/ps").json()["models"]
            assert model["name"] == "fake:latest" and model["expires_at"].startswith("9999")
            assert not adapter.closed
            http.post("/api/chat", json={**CHAT, "stream": False, "keep_alive": "300ms"})
            assert wait_for(lambda: adapter.closed, timeout=3)


def test_empty_prompt_loads_and_unloads():
    adapter = FakeAdapter()
    with fake_server(adapter) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            loaded = http.post("/api/generate", json={"model": FAKE}).json()
            assert (loaded["done"], loaded["done_reason"]) == (True, "load")
            assert [m["name"] for m in http.get("/api/ps").json()["models"]] == ["fake:latest"]
            unloaded = http.post("/api/chat", json={"model": FAKE, "messages": [], "keep_alive": 0}).json()
            assert unloaded["done_reason"] == "unload" and adapter.closed
            assert http.get("/api/ps").json() == {"models": []}


# --------------------------------------------------------------------------------------
# The store: tags, delete, pull
# --------------------------------------------------------------------------------------


@pytest.fixture
def temp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("PYENGINE_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    shutil.copy(SYNTH_MODEL, tmp_path / "models" / "tiny-test.gguf")
    return tmp_path


def test_tags_and_delete(temp_store):
    adapter = FakeAdapter()
    with fake_server(adapter) as server:
        client = ollama.Client(host=server.url)
        listed = {m.model: m for m in client.list().models}
        assert set(listed) == {"tiny-test:latest", "fake:latest"}
        assert listed["tiny-test:latest"].details.format == "gguf"
        assert listed["tiny-test:latest"].size == SYNTH_MODEL.stat().st_size
        with httpx.Client(base_url=server.url) as http:
            assert {m["id"] for m in http.get("/v1/models").json()["data"]} == {"tiny-test", "fake"}
        client.delete("tiny-test")
        assert not (temp_store / "models" / "tiny-test.gguf").exists()
        with pytest.raises(ollama.ResponseError) as info:
            client.delete("tiny-test")
        assert info.value.status_code == 404
        with pytest.raises(ollama.ResponseError) as info:
            client.delete(FAKE)  # served from a path given at start-up
        assert info.value.status_code == 400


def test_pull_streams_progress(temp_store, monkeypatch):
    calls = []

    def fake_pull(name, progress=True, callback=None):
        calls.append(name)
        total = 3000
        for done in (0, 1000, 2000, 3000):
            callback(f"pulling {name}", done, total)
            time.sleep(0.25)
        callback("verifying sha256 digest", 0, 0)
        callback("success", total, total)
        return temp_store / "models" / f"{name}.gguf"

    monkeypatch.setattr(store, "pull", fake_pull)
    with fake_server(FakeAdapter()) as server:
        client = ollama.Client(host=server.url)
        updates = list(client.pull("smollm2:135m", stream=True))
        assert calls == ["smollm2-135m"]
        statuses = [u.status for u in updates]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
        progress = [u for u in updates if u.total]
        assert progress and progress[-1].completed == progress[-1].total == 3000
        assert all(u.digest.startswith("sha256:") for u in progress)
        assert client.pull("smollm2-135m", stream=False).status == "success"

        def failing_pull(name, progress=True, callback=None):
            raise StoreError("the index is unreachable")

        monkeypatch.setattr(store, "pull", failing_pull)
        with pytest.raises(ollama.ResponseError, match="unreachable"):
            list(client.pull("smollm2-135m", stream=True))
        with pytest.raises(ollama.ResponseError) as info:
            client.pull("smollm2-135m", stream=False)
        assert info.value.status_code == 502
