"""Images through the server: Ollama's base64 `images` on /api/chat and /api/generate,
OpenAI's image_url parts (data: URIs; remote URLs only when the server allows them,
fetched within a size and time bound), `vision` in the capabilities of a model with a
projector (beside it, or --mmproj), and bad images refused with 400 at once."""

from __future__ import annotations

import base64
import http.server
import shutil
import struct
import threading
import time
import zlib

import httpx
import pytest
from conftest import DATA

from pyengine.server import ServerConfig
from server_support import running_server

VISION = DATA / "vision"
TEXT, MMPROJ, PNG = VISION / "gemma3-tiny.gguf", VISION / "gemma3-tiny.mmproj.gguf", VISION / "gemma3-tiny.png"
PLAIN = DATA / "synth" / "mistral3-q8_0.gguf"
IMAGE_TOKENS = 16
B64 = base64.b64encode(PNG.read_bytes()).decode()
URI = "data:image/png;base64," + B64


def config(**kwargs) -> ServerConfig:
    return ServerConfig(**{"models": (str(TEXT), str(PLAIN)), "n_ctx": 256, "n_threads": 2, "parallel": 1, **kwargs})


@pytest.fixture(scope="module")
def server():
    with running_server(config()) as running:
        yield running


def post(server, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=timeout)


def chat(server, content="What is this?", images=(), model="gemma3-tiny", **extra) -> httpx.Response:
    message = {"role": "user", "content": content, **({"images": list(images)} if images else {})}
    return post(server, "/api/chat", {"model": model, "messages": [message], "stream": False,
                                      "options": {"temperature": 0, "num_predict": 2}, **extra})


def huge_png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height pixels and holds almost none (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_capabilities_list_vision_for_a_model_with_a_projector(server):
    assert "vision" in post(server, "/api/show", {"model": "gemma3-tiny"}).json()["capabilities"]
    assert "vision" not in post(server, "/api/show", {"model": "mistral3-q8_0"}).json()["capabilities"]


def test_mmproj_flag_gives_a_model_its_projector(tmp_path):
    model = tmp_path / "elsewhere.gguf"
    shutil.copyfile(TEXT, model)
    with running_server(config(models=(str(model),))) as bare:
        assert "vision" not in post(bare, "/api/show", {"model": "elsewhere"}).json()["capabilities"]
    with running_server(config(models=(str(model),), mmproj=str(MMPROJ))) as given:
        assert "vision" in post(given, "/api/show", {"model": "elsewhere"}).json()["capabilities"]
        reply = chat(given, images=[B64], model="elsewhere")
        assert reply.status_code == 200, reply.text


def test_ollama_chat_and_generate_take_base64_images(server):
    text_only = chat(server).json()
    one = chat(server, images=[B64])
    assert one.status_code == 200, one.text
    two = chat(server, images=[B64, B64]).json()
    # each image is counted: its rows plus the tokens around them
    assert one.json()["prompt_eval_count"] >= text_only["prompt_eval_count"] + IMAGE_TOKENS
    assert two["prompt_eval_count"] - one.json()["prompt_eval_count"] >= IMAGE_TOKENS
    generated = post(server, "/api/generate", {"model": "gemma3-tiny", "prompt": "What is this?", "images": [B64],
                                               "stream": False, "options": {"temperature": 0, "num_predict": 2}})
    assert generated.status_code == 200, generated.text
    assert generated.json()["response"] == one.json()["message"]["content"]
    assert generated.json()["prompt_eval_count"] == one.json()["prompt_eval_count"]
    raw = post(server, "/api/generate", {"model": "gemma3-tiny", "prompt": "x", "raw": True, "images": [B64],
                                         "stream": False})
    assert raw.status_code == 400


def openai_chat(server, url: str) -> httpx.Response:
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]
    return post(server, "/v1/chat/completions", {"model": "gemma3-tiny", "messages": [{"role": "user", "content": parts}],
                                                 "max_tokens": 2, "temperature": 0})


def test_openai_image_url_parts_with_data_uris(server):
    reply = openai_chat(server, URI)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == chat(server, images=[B64]).json()["message"]["content"]
    remote = openai_chat(server, "http://127.0.0.1:9/photo.png")
    assert remote.status_code == 400 and "not fetched" in remote.json()["error"]["message"]


def test_images_count_against_the_context(server):
    reply = chat(server, images=[B64] * 20)   # 20 x (16 rows + markers) > 256
    assert reply.status_code == 400, reply.text


@pytest.mark.parametrize("image", [
    "not base64!",
    base64.b64encode(b"\x89PNG truncated").decode(),
    base64.b64encode(huge_png_header(100_000, 100_000)).decode(),
])
def test_bad_and_huge_images_are_400_within_a_second(server, image):
    chat(server, images=[B64])   # the model is loaded: the time below is the refusal's own
    started = time.monotonic()
    reply = chat(server, images=[image])
    assert reply.status_code == 400, reply.text
    assert time.monotonic() - started < 1.0


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/photo.png":
            body = PNG.read_bytes()
        elif self.path == "/big.png":
            body = b"\0" * (2 * 1024 * 1024)
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()   # no Content-Length: the size bound must hold while reading
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def image_host():
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=host.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{host.server_address[1]}"
    host.shutdown()
    host.server_close()


def test_remote_images_when_allowed_and_bounded(image_host):
    with running_server(config(models=(str(TEXT),), remote_images=True, remote_image_bytes=1024 * 1024)) as allowed:
        fetched = openai_chat(allowed, image_host + "/photo.png")
        assert fetched.status_code == 200, fetched.text
        assert fetched.json()["choices"][0]["message"]["content"] == \
            openai_chat(allowed, URI).json()["choices"][0]["message"]["content"]
        big = openai_chat(allowed, image_host + "/big.png")
        assert big.status_code == 400 and "larger than" in big.json()["error"]["message"]
        missing = openai_chat(allowed, image_host + "/nothing.png")
        assert missing.status_code == 400
