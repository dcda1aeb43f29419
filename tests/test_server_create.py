"""Ollama's /api/create, /api/copy and /api/blobs/:digest against a running server, through
httpx and through the official ollama client, with SmolLM2-135M and a synthetic GGUF in a
store of the test's own."""

from __future__ import annotations

import hashlib
import json
import os
import socket

import httpx
import ollama
import pytest
from conftest import SYNTH

from pyengine.server import ServerConfig
from server_support import running_server, wait_for

BASE = "smollm2-135m"
SYNTH_GGUF = SYNTH / "llama-bpe-q5_1-tied.gguf"
MAX_BLOB = 1 << 20
PIRATE = "You are a pirate named Blackbeard."


@pytest.fixture(scope="module")
def home(smollm2_path, tmp_path_factory):
    """A store holding only SmolLM2 (linked from the shared cache), used while the module runs."""
    folder = tmp_path_factory.mktemp("store")
    (folder / "models").mkdir()
    (folder / "models" / f"{BASE}.gguf").symlink_to(smollm2_path)
    before = os.environ.get("PYENGINE_HOME")
    os.environ["PYENGINE_HOME"] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("PYENGINE_HOME", None)
        else:
            os.environ["PYENGINE_HOME"] = before


@pytest.fixture(scope="module")
def server(home):
    with running_server(ServerConfig(parallel=1, max_queue=4, n_ctx=512, max_blob_bytes=MAX_BLOB)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def pirate(client):
    """A model made from SmolLM2 with a system prompt and greedy three-token replies."""
    client.create(model="pirate", from_=BASE, system=PIRATE, parameters={"temperature": 0, "num_predict": 3},
                  license="MIT, for the test")
    return "pirate"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def leftovers(home) -> list[str]:
    """Partial uploads still on disk."""
    return sorted(p.name for p in (home / "tmp").glob("*")) if (home / "tmp").is_dir() else []


def context_text(server, name: str, ids: list[int]) -> str:
    return server.state.registry.get_loaded(name).adapter.detokenize(ids)


# --------------------------------------------------------------------------------------
# Blobs
# --------------------------------------------------------------------------------------


def test_blob_upload_is_checked_against_its_digest(server, home):
    data = SYNTH_GGUF.read_bytes()
    digest = sha256(data)
    assert httpx.head(f"{server.url}/api/blobs/{digest}").status_code == 404
    wrong = sha256(b"something else")
    response = httpx.post(f"{server.url}/api/blobs/{wrong}", content=data)
    assert response.status_code == 400 and "digest mismatch" in response.json()["error"]
    assert not (home / "blobs" / wrong.replace(":", "-")).exists() and leftovers(home) == []
    assert httpx.post(f"{server.url}/api/blobs/{digest}", content=data).status_code == 201
    assert (home / "blobs" / digest.replace(":", "-")).read_bytes() == data
    assert httpx.head(f"{server.url}/api/blobs/{digest}").status_code == 200
    assert httpx.post(f"{server.url}/api/blobs/{digest}", content=data).status_code == 200  # already there
    for bad in ("sha256:xyz", "md5:" + "0" * 32, "sha256:..%2F..%2Fetc"):
        assert httpx.head(f"{server.url}/api/blobs/{bad}").status_code in (400, 404)
        assert httpx.post(f"{server.url}/api/blobs/{bad}", content=b"x").status_code in (400, 404)


def test_oversized_or_abandoned_uploads_leave_nothing(server, home):
    big = os.urandom(MAX_BLOB + 1)
    response = httpx.post(f"{server.url}/api/blobs/{sha256(big)}", content=big)
    assert response.status_code == 413
    # without a length: chunked, refused when the limit is passed
    halves = iter([big[:MAX_BLOB // 2], big[MAX_BLOB // 2:]])
    response = httpx.post(f"{server.url}/api/blobs/{sha256(big)}", content=halves)
    assert response.status_code == 413
    assert not (home / "blobs" / sha256(big).replace(":", "-")).exists()
    # a client that goes away halfway through
    half = os.urandom(MAX_BLOB // 2)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(f"POST /api/blobs/{sha256(half * 2)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Content-Length: {len(half) * 2}\r\n\r\n".encode() + half)
    assert wait_for(lambda: leftovers(home) == [], timeout=10), leftovers(home)
    assert not (home / "blobs" / sha256(half * 2).replace(":", "-")).exists()


# --------------------------------------------------------------------------------------
# Create from a blob, through the official client
# --------------------------------------------------------------------------------------


def test_create_from_an_uploaded_gguf_with_the_ollama_client(server, client, tmp_path):
    digest = client.create_blob(SYNTH_GGUF)
    assert client.create(model="tiny", files={"model.gguf": digest}).status == "success"
    assert "tiny:latest" in [m.model for m in client.list().models]
    shown = client.show("tiny")
    assert shown.details.family == "llama" and shown.details.parent_model == digest
    reply = client.generate(model="tiny", prompt="hello", options={"num_predict": 4, "temperature": 0})
    assert reply.done and reply.eval_count == 4
    # a blob that is not a GGUF cannot be a model
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a gguf" * 100)
    junk_digest = client.create_blob(junk)
    with pytest.raises(ollama.ResponseError) as caught:
        client.create(model="junk", files={"model.gguf": junk_digest})
    assert caught.value.status_code == 400 and "GGUF" in caught.value.error
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(SYNTH_GGUF.read_bytes()[:4096])
    with pytest.raises(ollama.ResponseError) as caught:
        client.create(model="junk", files={"model.gguf": client.create_blob(truncated)})
    assert caught.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as caught:
        client.create(model="junk", files={"model.gguf": sha256(b"never uploaded")})
    assert caught.value.status_code == 400 and "blob not found" in caught.value.error
    assert "junk:latest" not in [m.model for m in client.list().models]


def test_create_streams_status_lines(server):
    with httpx.stream("POST", f"{server.url}/api/create", json={"model": "streamed", "from": BASE}) as response:
        assert response.status_code == 200
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines[-1] == {"status": "success"} and all("status" in line for line in lines)
    assert httpx.request("DELETE", f"{server.url}/api/delete", json={"model": "streamed"}).status_code == 200


@pytest.mark.parametrize("body, needle", [
    ({"model": "x", "from": BASE, "parameters": {"temprature": 0.5}}, "temprature"),
    ({"model": "x", "from": BASE, "parameters": {"temperature": "hot"}}, "temperature"),
    ({"model": "x", "from": BASE, "parameters": {"top_p": 7}}, "top_p"),
    ({"model": "x", "from": BASE, "template": "{% for m in messages %}"}, "template"),
    ({"model": "x", "from": BASE, "template": "{{ .System }} {{ .Prompt }}"}, "Go template"),
    ({"model": "x", "from": BASE, "messages": [{"role": "wizard", "content": "hi"}]}, "wizard"),
    ({"model": "x"}, "neither 'from' or 'files'"),
    ({"model": "../x", "from": BASE}, "invalid model name"),
    ({"model": "x", "from": BASE, "quantize": "q4_K_M"}, "quantize"),
    ({"model": BASE, "from": BASE}, "in the store already"),
    ({"model": "x", "files": {"../m.gguf": "sha256:" + "0" * 64}}, "relative"),
    ({"model": "x", "from": BASE, "files": {"m.gguf": "sha256:" + "0" * 64}}, "not both"),
    ({"model": "x", "from": BASE, "unknown": 1}, "unknown"),
    ({"model": "x", "modelfile": f"FROM {BASE}"}, "old form"),
])
def test_create_refuses_bad_requests(server, body, needle):
    response = httpx.post(f"{server.url}/api/create", json=body)
    assert response.status_code == 400, response.text
    assert needle in response.json()["error"]
    assert "x:latest" not in [m["name"] for m in httpx.get(f"{server.url}/api/tags").json()["models"]]


def test_create_from_a_missing_model_is_404(server):
    response = httpx.post(f"{server.url}/api/create", json={"model": "x", "from": "no-such-model"})
    assert response.status_code == 404


# --------------------------------------------------------------------------------------
# What a created model does to requests
# --------------------------------------------------------------------------------------


def test_created_parameters_are_the_request_defaults(server, client, pirate):
    first = client.generate(model=pirate, prompt="Who are you?")
    second = client.generate(model=pirate, prompt="Who are you?")
    assert first.eval_count == 3 and first.response == second.response  # num_predict 3, temperature 0
    assert client.generate(model=pirate, prompt="Who are you?", options={"num_predict": 5}).eval_count == 5
    chat = client.chat(model=pirate, messages=[{"role": "user", "content": "Who are you?"}])
    assert chat.eval_count == 3
    body = {"model": pirate, "messages": [{"role": "user", "content": "Who are you?"}]}
    openai_reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    assert openai_reply["usage"]["completion_tokens"] == 3
    assert httpx.post(f"{server.url}/v1/chat/completions", json={**body, "max_tokens": 4},
                      timeout=60).json()["usage"]["completion_tokens"] == 4


def test_created_system_prompt_is_used_when_the_request_has_none(server, client, pirate):
    reply = client.generate(model=pirate, prompt="Who are you?")
    assert PIRATE in context_text(server, pirate, reply.context)
    own = client.generate(model=pirate, prompt="Who are you?", system="You are a cat.")
    assert "You are a cat." in context_text(server, pirate, own.context)
    assert PIRATE not in context_text(server, pirate, own.context)
    # chat: the created system turn is exactly what the plain model gets when it is sent along
    question = [{"role": "user", "content": "Who are you?"}]
    created = client.chat(model=pirate, messages=question)
    plain = client.chat(model=BASE, messages=[{"role": "system", "content": PIRATE}, *question],
                        options={"num_predict": 3, "temperature": 0})
    assert created.prompt_eval_count == plain.prompt_eval_count
    assert created.message.content == plain.message.content


def test_created_template_and_messages_replace_the_files(server, client):
    template = ("{% for m in messages %}XYZZY {{ m.role }}: {{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}XYZZY assistant:{% endif %}")
    client.create(model="templated", from_=BASE, template=template, parameters={"num_predict": 2},
                  messages=[{"role": "user", "content": "Say arr."}, {"role": "assistant", "content": "Arr."}])
    reply = client.generate(model="templated", prompt="And now?")
    text = context_text(server, "templated", reply.context)
    assert "XYZZY user: Say arr.\nXYZZY assistant: Arr.\nXYZZY user: And now?" in text
    assert "<|im_start|>" not in text
    shown = client.show("templated")
    assert shown.template == template
    assert 'MESSAGE user "Say arr."' in shown.modelfile or "MESSAGE user Say arr." in shown.modelfile
    # the file's own model is untouched
    assert client.show(BASE).template != template


def test_show_reports_a_created_models_settings(server, client, pirate):
    shown = client.show(pirate)
    lines = shown.parameters.splitlines()
    assert [line.split()[0] for line in lines] == ["temperature", "num_predict"]
    assert [line.split()[1] for line in lines] == ["0", "3"]
    assert shown.license == "MIT, for the test"
    assert shown.template == client.show(BASE).template
    assert shown.details.parent_model == BASE
    modelfile = shown.modelfile
    assert "\nFROM " in modelfile and f"SYSTEM {PIRATE}" in modelfile
    assert "PARAMETER temperature 0" in modelfile and "PARAMETER num_predict 3" in modelfile
    assert "LICENSE MIT, for the test" in modelfile
    raw = httpx.post(f"{server.url}/api/show", json={"model": pirate}).json()
    assert raw["system"] == PIRATE
    assert "pirate" in [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]


def test_a_created_model_made_from_a_created_one_keeps_its_settings(client, pirate):
    client.create(model="pirate-captain", from_=pirate, parameters={"num_predict": 2})
    shown = client.show("pirate-captain")
    assert shown.modelfile.count("PARAMETER") == 2 and "PARAMETER num_predict 2" in shown.modelfile
    assert PIRATE in shown.modelfile
    assert client.generate(model="pirate-captain", prompt="Hi").eval_count == 2
    client.delete("pirate-captain")


# --------------------------------------------------------------------------------------
# Copy and delete
# --------------------------------------------------------------------------------------


def test_copy_then_delete_the_copy_keeps_the_original(server, client, pirate, home):
    assert client.copy(pirate, "pirate-copy").status == "success"
    assert client.show("pirate-copy").modelfile.count(PIRATE) == 1
    assert client.generate(model="pirate-copy", prompt="Hi").eval_count == 3
    assert client.delete("pirate-copy").status == "success"
    names = [m.model for m in client.list().models]
    assert "pirate-copy:latest" not in names and "pirate:latest" in names
    assert client.generate(model=pirate, prompt="Hi").eval_count == 3
    # a copy of a plain model runs its file; deleting the copy leaves the file
    client.copy(BASE, "smol-copy")
    assert client.show("smol-copy").details.family == "llama"
    client.delete("smol-copy")
    assert (home / "models" / f"{BASE}.gguf").is_file()
    assert BASE + ":latest" in [m.model for m in client.list().models]


def test_copy_refuses_bad_names(server):
    for body, status in [({"source": "no-such", "destination": "y"}, 404),
                         ({"source": BASE, "destination": "../y"}, 400),
                         ({"source": BASE, "destination": BASE}, 400),
                         ({"source": BASE}, 400)]:
        assert httpx.post(f"{server.url}/api/copy", json=body).status_code == status, body


def test_cli_cp_copies_in_the_store(home, capsys):
    from pyengine import cli, store

    assert cli.main(["cp", BASE, "smol-cli"]) == 0
    assert capsys.readouterr().out == f"copied {BASE} to smol-cli\n"
    assert store.find_local("smol-cli") == store.find_local(BASE)
    assert "smol-cli" in [m.name for m in store.list_models()]
    assert cli.main(["cp", "no-such-model", "y"]) == 1
    assert cli.main(["cp", BASE, "../y"]) == 1
    assert cli.main(["rm", "smol-cli"]) == 0
    assert (home / "models" / f"{BASE}.gguf").is_file() and store.find_local("smol-cli") is None


def test_removing_the_base_model_leaves_a_created_one_working(server, client, home):
    import shutil

    shutil.copyfile(SYNTH_GGUF, home / "models" / "synth-base.gguf")
    client.create(model="derived", from_="synth-base", system="Be brief.", parameters={"num_predict": 2})
    assert client.delete("synth-base").status == "success"
    assert not (home / "models" / "synth-base.gguf").exists()
    assert client.generate(model="derived", prompt="hello").eval_count == 2
    assert client.show("derived").details.parent_model == "synth-base"
    client.delete("derived")
    assert "derived:latest" not in [m.model for m in client.list().models]
    assert list((home / "links").glob("derived*")) == []


def test_a_created_num_ctx_sizes_the_models_instance(server, client):
    client.create(model="roomy", from_=BASE, parameters={"num_ctx": 1024, "num_predict": 1})
    client.generate(model="roomy", prompt="hello")
    assert server.state.registry.get_loaded("roomy", 1024) is not None  # the server's default is 512
    assert server.state.registry.get_loaded("roomy", 512) is None
    client.delete("roomy")
