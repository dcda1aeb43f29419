"""A request's num_ctx picks a model instance of that context size: reused when one
is loaded (or a larger one), loaded otherwise within the registry's limits (loaded
models, KV memory, keep_alive), refused beyond the model's trained context."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from pyengine.server import ServerConfig
from server_support import FakeAdapter, running_server, wait_for

SYNTH = Path(__file__).parent / "data" / "synth"
SYNTH_MODEL = SYNTH / "llama-f16.gguf"        # trained context 4096, 256 KV bytes per cell
FAKE = "fake"


class RecordingAdapter(FakeAdapter):
    """A fake model that remembers the context it was loaded with and each request's options."""

    def __init__(self, n_ctx: int) -> None:
        super().__init__(pieces=2, delay_s=0.01)
        self.n_ctx = n_ctx
        self.options: list[dict] = []

    def start_chat(self, messages, **kwargs):
        self.options.append(dict(kwargs.get("options") or {}))
        return super().start_chat(messages)

    def start_generate(self, prompt, **kwargs):
        self.options.append(dict(kwargs.get("options") or {}))
        return super().start_generate(prompt)


class Loads:
    """A loader that makes a new RecordingAdapter per load and keeps them in order."""

    def __init__(self) -> None:
        self.adapters: list[RecordingAdapter] = []
        self.lock = threading.Lock()

    def __call__(self, name, path, config):
        adapter = RecordingAdapter(config.n_ctx)
        with self.lock:
            self.adapters.append(adapter)
        return adapter

    @property
    def sizes(self) -> list[int]:
        return [adapter.n_ctx for adapter in self.adapters]


def fake_server(loads: Loads, **config):
    config.setdefault("sweep_interval_s", 0.05)
    return running_server(ServerConfig(**config), loader=loads, served={FAKE: SYNTH_MODEL})


def chat(http: httpx.Client, num_ctx=None, **extra) -> httpx.Response:
    body = {"model": FAKE, "messages": [{"role": "user", "content": "Hi"}], "stream": False, **extra}
    if num_ctx is not None:
        body["options"] = {"num_ctx": num_ctx}
    return http.post("/api/chat", json=body)


def loaded_sizes(server) -> list[int]:
    return [entry.n_ctx for entry in server.state.registry.loaded()]


# --------------------------------------------------------------------------------------
# Choosing an instance
# --------------------------------------------------------------------------------------


def test_equal_sizes_reuse_one_instance():
    loads = Loads()
    with fake_server(loads) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(3):
            assert chat(http, 1024).status_code == 200
        assert loads.sizes == [1024]
        ps = http.get("/api/ps").json()["models"]
        assert [m["context_length"] for m in ps] == [1024]


def test_without_num_ctx_the_default_size_is_loaded():
    loads = Loads()
    with fake_server(loads) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert chat(http).status_code == 200
        assert loads.sizes == [4096]      # min(trained 4096, the LLM's default 4096)
        assert "num_ctx" not in loads.adapters[0].options[0]
    loads = Loads()
    with fake_server(loads, n_ctx=256) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert chat(http).status_code == 200
        assert loads.sizes == [256]       # the server's --ctx


def test_a_second_size_is_loaded_beside_the_first():
    loads = Loads()
    with fake_server(loads, n_ctx=256) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert chat(http).status_code == 200
        assert chat(http, 2048).status_code == 200
        assert loads.sizes == [256, 2048]
        assert sorted(loaded_sizes(server)) == [256, 2048]
        assert loads.adapters[1].options[0]["num_ctx"] == 2048


def test_a_smaller_request_reuses_a_larger_instance_and_is_bounded_to_its_size():
    loads = Loads()
    with fake_server(loads, n_ctx=256) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert chat(http, 2048).status_code == 200
        assert chat(http, 1000).status_code == 200
        assert chat(http).status_code == 200        # no num_ctx: the default (256), from the 2048 one
        assert loads.sizes == [2048]
        assert [o["num_ctx"] for o in loads.adapters[0].options] == [2048, 1000, 256]


def test_load_only_requests_honour_num_ctx():
    loads = Loads()
    with fake_server(loads) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        reply = http.post("/api/generate", json={"model": FAKE, "options": {"num_ctx": 512}})
        assert reply.status_code == 200 and reply.json()["done_reason"] == "load"
        assert loads.sizes == [512]


def test_openai_routes_take_num_ctx():
    loads = Loads()
    with fake_server(loads) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        body = {"model": FAKE, "messages": [{"role": "user", "content": "Hi"}], "num_ctx": 1536}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        assert loads.sizes == [1536]
        bad = http.post("/v1/chat/completions", json={**body, "num_ctx": "big"})
        assert bad.status_code == 400 and "num_ctx" in bad.json()["error"]["message"]


# --------------------------------------------------------------------------------------
# Limits
# --------------------------------------------------------------------------------------


def test_beyond_the_trained_context_is_400_naming_both_numbers():
    loads = Loads()
    with fake_server(loads) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        reply = chat(http, 8192)
        assert reply.status_code == 400
        message = reply.json()["error"]
        assert "8192" in message and "4096" in message and "num_ctx" in message
        reply = http.post("/v1/completions", json={"model": FAKE, "prompt": "Hi", "num_ctx": 5000})
        assert reply.status_code == 400
        assert "5000" in reply.json()["error"]["message"] and "4096" in reply.json()["error"]["message"]
        assert chat(http, 4096).status_code == 200    # the trained context itself is fine
        assert loads.sizes == [4096]


def test_max_loaded_models_evicts_the_least_recently_used_size():
    loads = Loads()
    with fake_server(loads, n_ctx=256, max_loaded_models=2) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        for size in (512, 1024):
            assert chat(http, size).status_code == 200
        assert chat(http, 512).status_code == 200    # 512 is now the more recently used
        assert chat(http, 2048).status_code == 200
        assert sorted(loaded_sizes(server)) == [512, 2048]
        closed = {adapter.n_ctx: adapter.closed for adapter in loads.adapters}
        assert closed == {512: False, 1024: True, 2048: False}


def test_kv_memory_budget_evicts_idle_instances_and_refuses_what_cannot_fit():
    per_sequence = 256 * 1024                   # llama-f16: 256 bytes a cell; 1024 cells
    loads = Loads()
    with fake_server(loads, parallel=1, max_loaded_models=8, kv_memory_bytes=3 * per_sequence) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        assert chat(http, 1024).status_code == 200
        assert chat(http, 2048).status_code == 200       # 3 of 3 "MiB" used
        assert chat(http, 3000).status_code == 200       # evicts the LRU (1024), then 2048 (still no room)
        assert loaded_sizes(server) == [3000]
        assert [a.closed for a in loads.adapters] == [True, True, False]
        # larger than the whole budget: never fits
        too_big = chat(http, 4000)
        assert too_big.status_code == 400 and "KV cache" in too_big.json()["error"]
        assert "4000" in too_big.json()["error"]

        # a busy instance holds its room: 503 with Retry-After until it is done
        slow = loads.adapters[-1]
        slow.pieces, slow.delay_s = 40, 0.05
        streaming = threading.Thread(target=lambda: chat(http, 3000))
        streaming.start()
        assert wait_for(lambda: server.state.registry.get_loaded(FAKE, 3000).active == 1)
        with httpx.Client(base_url=server.url, timeout=30) as other:
            busy = chat(other, 3072)
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
            assert "retry later" in busy.json()["error"]
        streaming.join()
        assert chat(http, 3072).status_code == 200       # idle now: evicted to make room
        assert loaded_sizes(server) == [3072]


def test_keep_alive_applies_to_each_instance():
    loads = Loads()
    with fake_server(loads, n_ctx=256) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert chat(http).status_code == 200
        assert chat(http, 1024, keep_alive=0).status_code == 200
        # the instance leaves the registry first and is closed after (off the event loop)
        assert wait_for(lambda: loaded_sizes(server) == [256] and loads.adapters[1].closed)
        assert [a.closed for a in loads.adapters] == [False, True]


# --------------------------------------------------------------------------------------
# Real models
# --------------------------------------------------------------------------------------


def test_synthetic_model_gets_the_context_it_asks_for():
    """A real (synthetic) model loaded with 128 tokens: a 200-token prompt fits only with
    num_ctx, and a request without num_ctx is still bounded to 128 on the larger instance."""
    prompt = [5] * 200
    body = {"model": "synth", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    with running_server(ServerConfig(n_ctx=128, parallel=1), served={"synth": SYNTH_MODEL}) as server, \
            httpx.Client(base_url=server.url, timeout=120) as http:
        short = http.post("/v1/completions", json=body)
        assert short.status_code == 400 and "128" in short.json()["error"]["message"]
        reply = http.post("/v1/completions", json={**body, "num_ctx": 512})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["prompt_tokens"] == 200
        llm = server.state.registry.get_loaded("synth", 512).adapter.llm
        assert llm.n_ctx == 512
        again = http.post("/v1/completions", json=body)
        assert again.status_code == 400 and "128" in again.json()["error"]["message"]


def test_smollm2_serves_num_ctx_8192(smollm2_path):
    """What llama-index's Ollama LLM sends by default: SmolLM2 is trained for 8192."""
    with running_server(ServerConfig(parallel=1)) as server, httpx.Client(base_url=server.url, timeout=300) as http:
        body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "stream": False,
                "options": {"num_ctx": 8192, "num_predict": 3, "temperature": 0}}
        reply = http.post("/api/chat", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["eval_count"] == 3
        ps = http.get("/api/ps").json()["models"]
        assert [m["context_length"] for m in ps] == [8192]
        assert server.state.registry.get_loaded("smollm2-135m", 8192).adapter.llm.n_ctx == 8192
        beyond = http.post("/api/chat", json={**body, "options": {"num_ctx": 16384}})
        assert beyond.status_code == 400
        assert "16384" in beyond.json()["error"] and "8192" in beyond.json()["error"]
