"""Operations endpoints: /health (llama-server's readiness check), /metrics
(Prometheus text format), /api/version (an Ollama release number beside pyengine's)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import httpx

from pyengine import __version__
from pyengine.server import ServerConfig
from server_support import FakeAdapter, fake_loader, running_server, wait_for

SYNTH_MODEL = Path(__file__).parent / "data" / "synth" / "llama-f16.gguf"
FAKE = "fake"
CHAT = {"model": FAKE, "messages": [{"role": "user", "content": "Hi"}]}


class GatedLoader:
    """Loads a FakeAdapter once `release` is set (or fails with `error`), so a test sees the load in progress."""

    def __init__(self, error: Exception | None = None) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.error = error

    def __call__(self, name, path, config):
        self.started.set()
        assert self.release.wait(30)
        if self.error is not None:
            raise self.error
        return FakeAdapter(pieces=3, delay_s=0.01)


# --------------------------------------------------------------------------------------
# /health
# --------------------------------------------------------------------------------------


def test_health_is_503_while_the_default_model_loads_then_ok():
    loader = GatedLoader()
    with running_server(loader=loader, served={FAKE: SYNTH_MODEL}, preload=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        assert loader.started.wait(10)
        loading = http.get("/health")
        assert loading.status_code == 503 and loading.json() == {"status": "loading model"}
        loader.release.set()
        assert wait_for(lambda: http.get("/health").status_code == 200, timeout=10)
        assert http.get("/health").json() == {"status": "ok"}
        assert server.state.registry.get_loaded(FAKE) is not None  # loaded at start-up, not on a request
        assert http.head("/health").status_code == 200


def test_health_waits_for_the_first_load_without_preload():
    loader = GatedLoader()
    loader.release.set()
    with running_server(loader=loader, served={FAKE: SYNTH_MODEL}) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        before = http.get("/health")
        assert before.status_code == 503 and before.json()["status"] != "ok"
        assert http.post("/api/chat", json={**CHAT, "stream": False}).status_code == 200
        assert http.get("/health").json() == {"status": "ok"}


def test_health_reports_a_failed_default_load():
    loader = GatedLoader(error=RuntimeError("weights are gone"))
    loader.release.set()
    with running_server(loader=loader, served={FAKE: SYNTH_MODEL}, preload=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        assert wait_for(lambda: http.get("/health").json()["status"] == "error", timeout=10)
        failed = http.get("/health")
        assert failed.status_code == 503 and "weights are gone" in failed.json()["error"]


def test_health_without_a_default_model_is_ok():
    with running_server(served={}) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/health").json() == {"status": "ok"}


def test_health_is_public_but_metrics_and_version_need_the_key():
    config = ServerConfig(api_key="sekrit")
    with running_server(config, loader=fake_loader(FakeAdapter()), served={}) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 401
        assert http.get("/api/version").status_code == 401
        assert http.post("/health").status_code in (401, 405)
        key = {"Authorization": "Bearer sekrit"}
        assert http.get("/metrics", headers=key).status_code == 200
        assert http.get("/api/version", headers=key).status_code == 200
        # the host check still applies to all three
        for path in ("/health", "/metrics", "/api/version"):
            assert http.get(path, headers={**key, "Host": "evil.example"}).status_code == 403


# --------------------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse_exposition(text: str) -> tuple[dict[str, str], dict[tuple[str, frozenset], float]]:
    """Prometheus text format 0.0.4: the TYPE of each family and every sample's value
    (keyed by name and label set); fails on any line that is not well formed."""
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset], float] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped") and name not in types
            types[name] = kind
            continue
        if line.startswith("# HELP ") or not line:
            continue
        match = _SAMPLE.match(line)
        assert match, f"bad sample line {line!r}"
        name, labels_text, value = match.groups()
        pairs = _LABEL.findall(labels_text or "")
        assert ",".join(f'{k}="{v}"' for k, v in pairs) == (labels_text or ""), f"bad labels in {line!r}"
        labels = frozenset(pairs)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        assert family in types, f"sample {name} has no TYPE line"
        key = (name, labels)
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
    return types, samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def check_histogram(samples, name: str) -> None:
    buckets = sorted((float(dict(labels)["le"]), count) for (sample, labels), count in samples.items()
                     if sample == f"{name}_bucket")
    counts = [count for _, count in buckets]
    assert counts == sorted(counts), "buckets must be cumulative"
    assert buckets[-1][0] == float("inf") and buckets[-1][1] == value(samples, f"{name}_count")


def scrape(http: httpx.Client):
    reply = http.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse_exposition(reply.text)


def test_metrics_count_requests_tokens_and_latencies():
    adapter = FakeAdapter(pieces=4, delay_s=0.01)  # each reply: 3 prompt tokens, 4 generated
    with running_server(ServerConfig(), loader=fake_loader(adapter), served={FAKE: SYNTH_MODEL}) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        types, before = scrape(http)
        assert types["pyengine_requests_total"] == "counter"
        assert types["pyengine_time_to_first_token_seconds"] == "histogram"
        assert types["pyengine_queue_depth"] == "gauge" and types["pyengine_kv_cells_used"] == "gauge"
        for _ in range(2):
            assert http.post("/api/chat", json={**CHAT, "stream": False}).status_code == 200
        assert http.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code == 200
        two = http.post("/v1/chat/completions", json={**CHAT, "n": 2})   # the prompt once, both choices' tokens
        assert two.status_code == 200 and len(two.json()["choices"]) == 2
        assert http.post("/api/chat", json={"model": FAKE, "messages": "nope"}).status_code == 400
        assert http.get("/no/such/path/1234").status_code == 404
        assert http.get("/v1/models/nothing-here").status_code in (400, 404)
        assert wait_for(lambda: server.state.admission.in_flight == 0)
        _, after = scrape(http)

        def moved(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        assert moved("pyengine_requests_total", route="/api/chat", method="POST", status="200") == 2
        assert moved("pyengine_requests_total", route="/api/chat", method="POST", status="400") == 1
        assert moved("pyengine_requests_total", route="/v1/chat/completions", method="POST", status="200") == 2
        assert moved("pyengine_requests_total", route="other", method="GET", status="404") == 1
        status = "400" if value(after, "pyengine_requests_total", route="/v1/models/{model}", method="GET",
                                status="400") else "404"
        assert moved("pyengine_requests_total", route="/v1/models/{model}", method="GET", status=status) == 1
        assert moved("pyengine_requests_total", route="/metrics", method="GET", status="200") == 1
        assert moved("pyengine_prompt_tokens_total") == 4 * 3
        assert moved("pyengine_generated_tokens_total") == 5 * 4
        assert moved("pyengine_time_to_first_token_seconds_count") == 5
        assert moved("pyengine_time_per_output_token_seconds_count") == 5
        check_histogram(after, "pyengine_time_to_first_token_seconds")
        check_histogram(after, "pyengine_time_per_output_token_seconds")
        assert value(after, "pyengine_requests_in_flight") == 0
        assert not any(name == "pyengine_requests_total" and dict(labels)["route"].startswith("/no/")
                       for name, labels in after)


def test_metrics_read_the_engine_of_each_loaded_model():
    with running_server(ServerConfig(n_ctx=256, parallel=2), served={"synth": SYNTH_MODEL}) as server, \
            httpx.Client(base_url=server.url, timeout=120) as http:
        body = {"model": "synth", "prompt": "Hello there", "stream": False,
                "options": {"num_predict": 5, "temperature": 0}}
        reply = http.post("/api/generate", json=body)
        assert reply.status_code == 200
        generated = reply.json()["eval_count"]
        prompt = reply.json()["prompt_eval_count"]
        _, samples = scrape(http)
        instance = {"model": "synth", "n_ctx": "256"}
        assert value(samples, "pyengine_kv_cells_used", **instance) > 0      # the cached prompt
        assert value(samples, "pyengine_active_sequences", **instance) == 0
        assert value(samples, "pyengine_queue_depth", **instance) == 0
        assert value(samples, "pyengine_generated_tokens_total") == generated
        assert value(samples, "pyengine_prompt_tokens_total") == prompt
        assert value(samples, "pyengine_time_per_output_token_seconds_sum") > 0


# --------------------------------------------------------------------------------------
# /api/version
# --------------------------------------------------------------------------------------


def test_api_version_is_an_ollama_release_beside_pyengines():
    with running_server(served={}) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        body = http.get("/api/version").json()
        assert re.fullmatch(r"\d+\.\d+\.\d+", body["version"])
        assert tuple(int(part) for part in body["version"].split(".")) >= (0, 12, 11)  # logprobs, thinking, tools
        assert body["pyengine_version"] == __version__
