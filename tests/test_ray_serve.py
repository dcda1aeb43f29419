"""pyengine on a local Ray cluster (pyengine.serve.ray): two replicas of SmolLM2 with one
thread each behind Serve's ingress, reached with the official openai and ollama clients.
The cluster is started here, on 127.0.0.1, and stopped at the end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time

import httpx
import ollama
import openai
import pytest

from pyengine.errors import InvalidOptionError
from pyengine.serve.prefix import prefix_keys

MODEL = "smollm2-135m"
HEADER = "x-pyengine-replica"


# --------------------------------------------------------------------------------------
# without a cluster
# --------------------------------------------------------------------------------------


def _chat(*contents: str, model: str = MODEL) -> bytes:
    roles = ["system"] + ["user", "assistant"] * len(contents)
    messages = [{"role": role, "content": text} for role, text in zip(roles, contents)]
    return json.dumps({"model": model, "messages": messages}).encode()


def test_a_second_turn_extends_its_first_turns_prefix_keys():
    first = prefix_keys(_chat("Be brief.", "Hi, I am Ann."))
    second = prefix_keys(_chat("Be brief.", "Hi, I am Ann.", "Hello Ann!", "What is my name?"))
    other = prefix_keys(_chat("Be brief.", "Hi, I am Bob."))
    assert len(first) == 2 and second[: len(first)] == first and len(second) == 4
    assert other[0] == first[0] and other[1] != first[1]  # the system prompt is shared, the rest not
    assert prefix_keys(_chat("Be brief.", "Hi, I am Ann.", model="other"))[0] != first[0]
    assert prefix_keys(json.dumps({"model": MODEL}).encode()) == []  # the model alone is no prefix
    long_prompt = json.dumps({"model": MODEL, "prompt": "x" * 100_000}).encode()
    assert len(prefix_keys(long_prompt)) == 64  # bounded
    assert prefix_keys(b"not json") == [] and prefix_keys(b"[1, 2]") == []


def test_the_cluster_flags_go_with_ray(capsys):
    from pyengine.cli import main
    from pyengine.serve.ray import parse_autoscale

    assert main(["serve", "--replicas", "2", "--port", "0"]) != 0
    assert "go with --ray" in capsys.readouterr().err
    assert parse_autoscale("1:4") == (1, 4)
    for bad in ("4", "3:1", "a:b", "0:0"):
        with pytest.raises(InvalidOptionError):
            parse_autoscale(bad)


# --------------------------------------------------------------------------------------
# on a local cluster
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(smollm2_path):
    import ray
    from ray import serve

    from pyengine.serve.ray import connect, deployment

    connect("local", num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(str(smollm2_path), replicas=2, threads=1, parallel=4, max_queue=24, ctx=1024),
                  name="pyengine", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _recorder(replicas: list[str]):
    async def record(response: httpx.Response) -> None:
        replicas.append(response.headers.get(HEADER))
    return {"response": [record]}


def test_sixteen_chats_through_both_clients_spread_over_both_replicas(cluster):
    replicas: list[str] = []

    async def main():
        oai = openai.AsyncOpenAI(base_url=f"{cluster}/v1", api_key="none", max_retries=0,
                                 http_client=httpx.AsyncClient(event_hooks=_recorder(replicas), timeout=120))
        oll = ollama.AsyncClient(host=cluster, event_hooks=_recorder(replicas), timeout=120)

        async def with_openai(i):
            reply = await oai.chat.completions.create(
                model=MODEL, max_tokens=12, temperature=0,
                messages=[{"role": "user", "content": f"Name a colour. ({i})"}])
            return reply.choices[0].message.content

        async def with_ollama(i):
            reply = await oll.chat(model=MODEL, messages=[{"role": "user", "content": f"Name a fruit. ({i})"}],
                                   options={"num_predict": 12, "temperature": 0})
            return reply.message.content

        return await asyncio.gather(*[with_openai(i) for i in range(8)], *[with_ollama(i) for i in range(8)])

    replies = asyncio.run(main())
    assert len(replies) == 16 and all(replies)
    assert len(replicas) == 16 and None not in replicas
    assert len(set(replicas)) == 2, replicas
    assert min(replicas.count(name) for name in set(replicas)) >= 4, replicas


def test_each_second_turn_lands_on_its_first_turns_replica(cluster):
    async def main():
        async with httpx.AsyncClient(base_url=cluster, timeout=120) as client:
            async def turn(messages, stream):
                if stream:  # the Ollama route, streamed
                    body = {"model": MODEL, "messages": messages, "options": {"num_predict": 8, "temperature": 0}}
                    async with client.stream("POST", "/api/chat", json=body) as response:
                        lines = [json.loads(line) async for line in response.aiter_lines() if line]
                    assert lines[-1]["done"], lines[-1]
                    return response.headers[HEADER], "".join(line["message"]["content"] for line in lines)
                body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                return response.headers[HEADER], response.json()["choices"][0]["message"]["content"]

            conversations = [[{"role": "system", "content": "You are a terse assistant."},
                              {"role": "user", "content": f"My name is Person{i}. Say hi."}] for i in range(8)]
            firsts = await asyncio.gather(*[turn(c, i % 2 == 0) for i, c in enumerate(conversations)])
            for conversation, (_, answer) in zip(conversations, firsts):
                conversation += [{"role": "assistant", "content": answer},
                                 {"role": "user", "content": "What is my name?"}]
            seconds = await asyncio.gather(*[turn(c, i % 2 == 1) for i, c in enumerate(conversations)])
            return [name for name, _ in firsts], [name for name, _ in seconds]

    firsts, seconds = asyncio.run(main())
    assert len(set(firsts)) == 2, firsts  # the first turns spread
    assert seconds == firsts


def test_requests_beyond_the_slots_and_the_line_get_503(cluster):
    async def main():
        async with httpx.AsyncClient(base_url=cluster, timeout=120) as client:
            async def one(i):
                response = await client.post("/api/generate", json={
                    "model": MODEL, "prompt": f"Tell a story. ({i})", "stream": False, "options": {"num_predict": 64}})
                return response.status_code, response.json(), response.headers
            return await asyncio.gather(*[one(i) for i in range(64)])

    results = asyncio.run(main())
    statuses = [status for status, _, _ in results]
    assert set(statuses) == {200, 503}, statuses
    assert statuses.count(200) >= 8  # 2 replicas x 4 slots, then the line of 24
    # 64 - 8 - 24 = 32 find no room when all arrive before any is done; a request done early
    # (64 tokens take a second or more; a story may end sooner) makes room for a later one
    assert statuses.count(503) >= (64 - 8 - 24) // 2, statuses
    for status, body, headers in results:
        if status == 503:  # in Ollama's shape, as the single server's
            assert isinstance(body["error"], str) and headers["retry-after"] == "1"


def _replica_pids() -> dict[str, int]:
    import ray

    pids = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if "#PyengineReplica#" in actor["name"]:
            handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
            pids[actor["name"].rsplit("#", 1)[1]] = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
    return pids


def _running_replicas() -> int:
    from ray import serve

    states = serve.status().applications["pyengine"].deployments["PyengineReplica"].replica_states
    return states.get("RUNNING", 0)


def test_a_killed_replica_fails_over_and_comes_back(cluster):
    pids = _replica_pids()
    assert len(pids) == 2
    victim, victim_pid = next(iter(pids.items()))

    async def one(client, i):
        body = {"model": MODEL, "stream": True, "max_tokens": 32, "temperature": 0,
                "messages": [{"role": "user", "content": f"Count to twenty. ({i})"}]}
        began = time.monotonic()
        events = []
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                status = response.status_code
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
        except httpx.HTTPError as exc:
            return "transport", repr(exc), time.monotonic()
        if status != 200:
            return "status", status, time.monotonic()
        errors = [e for e in events if e != "[DONE]" and "error" in json.loads(e)]
        return ("error" if errors else "done"), events[-1:], time.monotonic()

    async def main():
        async with httpx.AsyncClient(base_url=cluster, timeout=httpx.Timeout(30.0)) as client:
            tasks = [asyncio.create_task(one(client, i)) for i in range(20)]
            await asyncio.sleep(0.8)
            killed_at = time.monotonic()
            os.kill(victim_pid, signal.SIGKILL)
            return killed_at, await asyncio.wait_for(asyncio.gather(*tasks), 60)

    killed_at, results = asyncio.run(main())
    outcomes = [kind for kind, _, _ in results]
    assert set(outcomes) <= {"done", "error", "status"}, results  # never a hang or a cut connection
    assert all(ended - killed_at < 10.0 for _, _, ended in results), [ended - killed_at for *_, ended in results]
    assert outcomes.count("done") >= 10, results  # the survivor's requests, and those moved to it
    assert outcomes.count("error") >= 1, results  # the streams the victim was sending: an error event

    deadline = time.monotonic() + 60
    while _running_replicas() < 2 or victim in _replica_pids():
        assert time.monotonic() < deadline, "the lost replica was not replaced"
        time.sleep(0.5)
    print("after the kill:", {kind: outcomes.count(kind) for kind in set(outcomes)},
          f"last ended {max(ended for *_, ended in results) - killed_at:.1f} s after it")
    replicas = []
    deadline = time.monotonic() + 30  # the ingress hears of the new replica shortly after Serve does
    while len(set(replicas)) < 2 or len(replicas) < 6:
        assert time.monotonic() < deadline, replicas
        response = httpx.post(f"{cluster}/api/generate", timeout=60, json={
            "model": MODEL, "prompt": f"Say a word. ({len(replicas)})", "stream": False, "options": {"num_predict": 4}})
        assert response.status_code == 200, response.text
        replicas.append(response.headers[HEADER])
    assert victim not in replicas, replicas
