"""pyengine on a local Ray cluster (pyengine.serve.ray): total throughput of 16 concurrent
chats with 1 replica and with N, and the time to first token of second turns of
conversations routed by prefix (PrefixAffinityRouter) against round-robin.

    PYTHONPATH=. python benchmarks/ray_serve.py [--model smollm2-135m] [--replicas 2]
                                                [--threads 1] [--tokens 32] [--cpus 2]

Each replica gets --threads threads and as many of the cluster's --cpus. Conversations run
one after another (turn one, then turn two), so round-robin sends every second turn to the
replica that has not seen its first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time

import httpx

SYSTEM = ("You are a careful assistant for a library. You answer questions about opening hours, "
          "loans, renewals, fines, rooms and events. ") * 6  # a long shared start, as real system prompts


async def throughput(url: str, model: str, tokens: int, count: int = 16) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one(i):
            response = await client.post("/v1/chat/completions", json={
                "model": model, "max_tokens": tokens, "temperature": 0,
                "messages": [{"role": "user", "content": f"Write a long story about the number {i}."}]})
            response.raise_for_status()
            return response.json()["usage"]["completion_tokens"]

        began = time.perf_counter()
        generated = await asyncio.gather(*[one(i) for i in range(count)])
        return sum(generated) / (time.perf_counter() - began)


async def second_turn_ttft(url: str, model: str, conversations: int = 8) -> tuple[list[float], int]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def turn(messages):
            began = time.perf_counter()
            first = None
            text = []
            async with client.stream("POST", "/v1/chat/completions", json={
                    "model": model, "messages": messages, "max_tokens": 16, "temperature": 0,
                    "stream": True}) as response:
                replica = response.headers.get("x-pyengine-replica")
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                        if delta and first is None:
                            first = time.perf_counter() - began
                        text.append(delta)
            return first, "".join(text), replica

        ttfts, same = [], 0
        for i in range(conversations):
            messages = [{"role": "system", "content": SYSTEM + f"Desk {i}."},
                        {"role": "user", "content": f"I am reader {i}. " + "Tell me about renewing my loans. " * 8}]
            _, answer, first_replica = await turn(messages)
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And the fines?"}]
            ttft, _, second_replica = await turn(messages)
            ttfts.append(ttft)
            same += first_replica == second_replica
        return ttfts, same


def deploy(args, replicas: int, router=None) -> str:
    from ray import serve

    from pyengine.serve.ray import deployment

    serve.run(deployment(args.model, replicas=replicas, threads=args.threads, router=router),
              name="pyengine", route_prefix="/")
    return args.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    import ray
    from ray import serve

    from pyengine.serve.ray import connect
    from pyengine.store import resolve_model

    args.model = str(resolve_model(args.model, progress=False))
    name = args.model.rsplit("/", 1)[-1].removesuffix(".gguf")
    connect("local", num_cpus=args.cpus, include_dashboard=False, object_store_memory=200 << 20,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        args.url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    serve.start(http_options={"host": "127.0.0.1", "port": int(args.url.rsplit(":", 1)[1])})
    try:
        from pyengine.serve.ray import RoundRobinRouter

        single = asyncio.run(throughput(deploy(args, 1), name, args.tokens))
        many = asyncio.run(throughput(deploy(args, args.replicas), name, args.tokens))
        print(f"throughput, 16 chats: 1 replica {single:.1f} tok/s, {args.replicas} replicas {many:.1f} tok/s "
              f"({many / single:.2f}x)", flush=True)
        prefix, prefix_same = asyncio.run(second_turn_ttft(deploy(args, args.replicas), name))
        robin, robin_same = asyncio.run(second_turn_ttft(deploy(args, args.replicas, RoundRobinRouter), name))
        print(f"second-turn TTFT, median: prefix routing {statistics.median(prefix) * 1000:.0f} ms "
              f"({prefix_same}/8 on the first turn's replica), round-robin {statistics.median(robin) * 1000:.0f} ms "
              f"({robin_same}/8); {statistics.median(robin) / statistics.median(prefix):.1f}x")
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
