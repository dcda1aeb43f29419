"""The ``pyengine`` command line: pull | list | rm | show | run | serve | bench.

Heavy modules (the store's HTTP client, the GGUF reader, the native core) are
imported inside the subcommands, so ``pyengine --help`` is instant and works on a
machine where the native core is not built.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with status 2 on bad usage
    from pyengine.errors import PyEngineError

    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`pyengine list | head`): nothing left to say to it.
        _silence_stdout()
        return EXIT_ERROR
    except (PyEngineError, OSError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


def build_parser() -> argparse.ArgumentParser:
    from pyengine import __version__

    parser = argparse.ArgumentParser(
        prog="pyengine",
        description="Run GGUF language models locally on the CPU.",
    )
    parser.add_argument("--version", action="version", version=f"pyengine {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (_add_pull, _add_list, _add_rm, _add_cp, _add_show, _add_run, _add_serve, _add_bench):
        add(commands)
    return parser


# --------------------------------------------------------------------------------------
# Argument types: bad values become usage errors (exit 2), before anything loads
# --------------------------------------------------------------------------------------


def _int_at_least(lowest: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {value}")
        return value

    return parse


# The KV cache types and their environment default, as in pyengine/kvcache/rows.py (named
# here so that `--help` does not load the native core; a test keeps the two equal).
KV_TYPES = ("f16", "q8_0")
KV_CACHE_TYPE_ENV = "PYENGINE_KV_CACHE_TYPE"


def _kv_type(text: str) -> str:
    name = text.strip().lower()
    if name not in KV_TYPES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(KV_TYPES)}, got {text!r}")
    return name


def _add_kv_type(sub) -> None:
    sub.add_argument("--kv-type", type=_kv_type, default=None, metavar="|".join(KV_TYPES),
                     help=f"KV cache type: f16, or q8_0 at about half the memory "
                     f"(default: ${KV_CACHE_TYPE_ENV}, else f16)")


def _use_kv_type(args) -> None:
    """--kv-type reaches every LLM the command builds (the server's and the bench's
    too) as the environment default that LLM reads."""
    import os

    if args.kv_type is not None:
        os.environ[KV_CACHE_TYPE_ENV] = args.kv_type


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0.0 or value == float("inf"):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


# --------------------------------------------------------------------------------------
# pull / list / rm
# --------------------------------------------------------------------------------------


def _add_pull(commands) -> None:
    sub = commands.add_parser(
        "pull", help="download a model into the local store",
        description="Download a catalog model or a Hugging Face Hub GGUF (hf.co/OWNER/REPO:TAG), "
                    "verify its sha256 and store it.",
    )
    sub.add_argument("name", metavar="NAME", help="model name, e.g. smollm2-135m, gemma3:270m or "
                                                  "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M")
    sub.set_defaults(handler=_cmd_pull)


def _cmd_pull(args) -> int:
    from pyengine import store

    name = store.canonical_name(args.name)
    existing = store.find_local(name)
    if existing is not None:
        print(f"{name} is already in the store: {existing}")
        return EXIT_OK
    path = store.pull(name, progress=True)
    print(f"pulled {name}: {path}")
    return EXIT_OK


def _add_list(commands) -> None:
    sub = commands.add_parser(
        "list", aliases=["ls"], help="list the models in the local store",
        description="List the models in the local store.",
    )
    sub.set_defaults(handler=_cmd_list)


def _cmd_list(args) -> int:
    import time

    from pyengine import store
    from pyengine.summary import human_bytes

    rows = [
        (m.name, human_bytes(m.size_bytes),
         time.strftime("%Y-%m-%d %H:%M", time.localtime(m.modified)))
        for m in store.list_models()
    ]
    if not rows:
        names = ", ".join(sorted(store.catalog()))
        print(f"no models in {store.cache_dir() / 'models'}; pull one of: {names}")
        return EXIT_OK
    _print_table(("NAME", "SIZE", "MODIFIED"), rows)
    return EXIT_OK


def _add_rm(commands) -> None:
    sub = commands.add_parser(
        "rm", help="delete models from the local store",
        description="Delete models from the local store.",
    )
    sub.add_argument("names", metavar="NAME", nargs="+", help="model name(s)")
    sub.set_defaults(handler=_cmd_rm)


def _cmd_rm(args) -> int:
    from pyengine import store
    from pyengine.errors import ModelNotFoundError

    for name in args.names:
        if not store.remove(name):
            raise ModelNotFoundError(f"model {name!r} is not in the store")
        print(f"deleted {store.canonical_name(name)}")
    return EXIT_OK


def _add_cp(commands) -> None:
    sub = commands.add_parser(
        "cp", help="copy a model in the local store under another name",
        description="Store SOURCE again as DESTINATION (as `ollama cp`): a created model's settings are "
                    "copied, the GGUF file is shared, and removing either leaves the other.",
    )
    sub.add_argument("source", metavar="SOURCE", help="model name")
    sub.add_argument("destination", metavar="DESTINATION", help="the new model's name")
    sub.set_defaults(handler=_cmd_cp)


def _cmd_cp(args) -> int:
    from pyengine import store
    from pyengine.errors import ModelNotFoundError

    source = store.canonical_name(args.source)
    path = store.find_local(source)
    if path is None:
        raise ModelNotFoundError(f"model {args.source!r} is not in the store")
    copy = store.copy_model(source, path, args.destination)
    print(f"copied {source} to {copy.name}")
    return EXIT_OK


# --------------------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------------------


def _add_show(commands) -> None:
    sub = commands.add_parser(
        "show", help="print a model's architecture and metadata",
        description="Print a model's architecture, sizes, weight types and tokenizer.",
    )
    sub.add_argument("model", metavar="NAME|PATH", help="model name (or hf.co/OWNER/REPO:TAG) or path to a .gguf file")
    sub.set_defaults(handler=_cmd_show)


def _cmd_show(args) -> int:
    from pyengine import store

    path = store.resolve_model(args.model, pull=False)
    from pyengine.summary import model_summary

    _print_table(None, model_summary(path))
    return EXIT_OK


# --------------------------------------------------------------------------------------
# run / bench
# --------------------------------------------------------------------------------------


def _add_run(commands) -> None:
    sub = commands.add_parser(
        "run", help="answer a prompt, or chat interactively",
        description="Answer PROMPT (or stdin when it is piped), streaming the reply to stdout; "
        "with no PROMPT on a terminal, chat interactively (/? lists the commands). "
        "The model is pulled on first use.",
    )
    sub.add_argument("model", metavar="NAME|PATH", help="model name (or hf.co/OWNER/REPO:TAG) or path to a .gguf file")
    sub.add_argument("prompt", metavar="PROMPT", nargs="?", help="prompt text (default: stdin)")
    sub.add_argument("--max-tokens", type=_int_at_least(1), default=128, help="default 128")
    sub.add_argument("--temperature", type=_non_negative_float, default=0.0,
                     help="0 is greedy (default)")
    sub.add_argument("--seed", type=_int_at_least(0), default=None, help="sampling seed")
    sub.add_argument("--ctx", type=_int_at_least(1), default=None,
                     help="context length (default: the model's, capped by the engine)")
    sub.add_argument("--threads", type=_int_at_least(1), default=None,
                     help="worker threads (default: physical cores)")
    sub.add_argument("--raw", action="store_true",
                     help="send the prompt as is, without the model's chat template")
    sub.add_argument("--image", dest="images", metavar="PATH", action="append", default=[],
                     help="an image for the prompt (PNG, JPEG, WebP or GIF; repeat for more); needs a projector")
    sub.add_argument("--mmproj", metavar="PATH", default=None,
                     help="vision projector (mmproj GGUF); default: MODEL.mmproj.gguf beside the model")
    _add_speculative(sub)
    _add_kv_type(sub)
    sub.set_defaults(handler=_cmd_run)


def _add_speculative(sub) -> None:
    sub.add_argument("--speculative", choices=("ngram", "draft"), default=None,
                     help="speculative decoding: drafts from the context's n-grams or from --draft-model, "
                          "verified in one batch (same output, faster where the text repeats)")
    sub.add_argument("--draft-model", metavar="NAME|PATH", default=None,
                     help="a small model with the same vocabulary, drafting for --speculative draft")


def _speculation(args) -> dict:
    """The LLM keywords of --speculative / --draft-model (a draft model alone means draft)."""
    from pyengine.errors import InvalidOptionError

    if args.speculative == "draft" and args.draft_model is None:
        raise InvalidOptionError("--speculative draft needs --draft-model")
    kwargs = {}
    if args.draft_model is not None:
        kwargs["draft_model"] = args.draft_model
    mode = args.speculative or ("draft" if args.draft_model else None)
    if mode is not None:
        kwargs["speculative"] = mode
    return kwargs


def _interactive(args) -> bool:
    return args.prompt is None and sys.stdin is not None and sys.stdin.isatty()


def _read_prompt(args) -> str:
    from pyengine.errors import InvalidOptionError

    if args.prompt is not None:
        return args.prompt
    if sys.stdin is None:
        raise InvalidOptionError("no PROMPT given and no stdin to read one from")
    prompt = sys.stdin.read()
    if not prompt.strip():
        raise InvalidOptionError("the prompt read from stdin is empty")
    return prompt


def _read_images(args) -> list[bytes]:
    from pathlib import Path

    from pyengine.errors import InvalidOptionError

    if args.images and args.raw:
        raise InvalidOptionError("--image goes with the chat template, not with --raw")
    try:
        return [Path(name).read_bytes() for name in args.images]
    except OSError as exc:
        raise InvalidOptionError(f"cannot read image {exc.filename}: {exc.strerror}") from None


def _projector(args, path) -> str | None:
    from pyengine.vision.files import projector_beside

    found = args.mmproj or projector_beside(path)
    return str(found) if found is not None else None


def _cmd_run(args) -> int:
    from pyengine import store

    interactive = _interactive(args)
    prompt = None if interactive else _read_prompt(args)  # before any download: usage mistakes cost nothing
    images = _read_images(args)
    path = store.resolve_model(args.model, pull=True, progress=True)
    from pyengine.api import LLM

    _use_kv_type(args)
    mmproj = _projector(args, path)
    llm = LLM(str(path), n_ctx=args.ctx, n_threads=args.threads, **({"mmproj": mmproj} if mmproj else {}),
              **_speculation(args))
    if interactive:
        return _chat_loop(args, llm, path)
    stop, extra = None, {}
    if not args.raw:
        from pyengine.session import prepare_chat

        prepared = prepare_chat(llm, [{"role": "user", "content": prompt}], images=images or None)
        prompt, stop = prepared.ids, list(prepared.stops) or None   # the fallback template's tags
        if prepared.images:
            extra["images"] = prepared.images
    pieces = llm.generate(
        prompt, max_tokens=args.max_tokens, temperature=args.temperature,
        stream=True, seed=args.seed, stop=stop, **extra,
    )
    last = ""
    for piece in pieces:
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()
            last = piece
    if not last.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    return EXIT_OK


def _chat_loop(args, llm, path) -> int:
    from pyengine.repl import ChatRepl, enable_line_editing

    enable_line_editing()
    options = {"temperature": args.temperature, "num_predict": args.max_tokens}
    if args.seed is not None:
        options["seed"] = args.seed
    return ChatRepl(llm, path, options).run()


# --------------------------------------------------------------------------------------
# serve
# --------------------------------------------------------------------------------------


def _add_serve(commands) -> None:
    from pyengine.server.config import API_KEY_ENV, DEFAULT_HOST, DEFAULT_PORT

    sub = commands.add_parser(
        "serve", help="serve models over HTTP (Ollama and OpenAI APIs)",
        description="Serve the models of the store (and those given with --model) over HTTP: "
        "Ollama's API under /api and OpenAI's under /v1. Listens on loopback unless told "
        f"otherwise; another address needs --api-key (or ${API_KEY_ENV}) or --insecure.",
    )
    sub.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    sub.add_argument("--port", type=_int_at_least(0), default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    sub.add_argument("--model", dest="models", metavar="NAME|PATH", action="extend", nargs="+", default=[],
                     help="models to serve besides the store's: names (pulled if needed) or .gguf paths")
    sub.add_argument("--parallel", type=_int_at_least(1), default=4,
                     help="requests generating at once per model (default 4)")
    sub.add_argument("--max-queue", type=_int_at_least(0), default=64,
                     help="requests waiting beyond those; more get 503 (default 64)")
    sub.add_argument("--api-key", default=None,
                     help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})")
    sub.add_argument("--insecure", action="store_true",
                     help="allow a non-loopback --host without an API key")
    sub.add_argument("--allow-origin", "--cors-origin", dest="cors_origins", metavar="ORIGIN", action="extend",
                     nargs="+", default=[],
                     help="web page origins allowed to call the server besides loopback ones ('*' for any)")
    sub.add_argument("--ctx", type=_int_at_least(1), default=None, help="context length of each loaded model")
    sub.add_argument("--threads", type=_int_at_least(1), default=None,
                     help="worker threads (default: physical cores)")
    sub.add_argument("--keep-alive", default="5m",
                     help="how long an idle model stays loaded: 30s, 5m, 1h, -1 = forever (default 5m)")
    sub.add_argument("--max-body-mb", type=_int_at_least(1), default=8,
                     help="largest request body in MiB (default 8)")
    sub.add_argument("--mmproj", metavar="PATH", default=None,
                     help="vision projector (mmproj GGUF) of the first --model; otherwise a model's "
                          "MODEL.mmproj.gguf beside it is used")
    sub.add_argument("--speculative", choices=("ngram", "draft"), default=None,
                     help="speculative decoding for requests that name none (their 'speculative' option); "
                          "draft applies to the model that has --draft-model")
    sub.add_argument("--draft-model", metavar="NAME|PATH", default=None,
                     help="draft model of the first --model (same vocabulary), for speculative=draft")
    sub.add_argument("--allow-remote-images", action="store_true",
                     help="fetch http(s) image URLs in requests (at most 32 MiB and 10 s each); "
                          "refused with 400 otherwise")
    sub.add_argument("--ray", action="store_true",
                     help="serve on a Ray cluster with Ray Serve (needs pyengine[ray] and --model)")
    sub.add_argument("--address", default=None,
                     help="with --ray: the cluster to join (default: start a local one)")
    sub.add_argument("--replicas", type=_int_at_least(1), default=1,
                     help="with --ray: engine replicas, each with its own copy of the model (default 1)")
    sub.add_argument("--autoscale", metavar="MIN:MAX", default=None,
                     help="with --ray: scale between MIN and MAX replicas on the requests in flight")
    _add_kv_type(sub)
    sub.set_defaults(handler=_cmd_serve)


def _cmd_serve(args) -> int:
    from pyengine.errors import InvalidOptionError
    from pyengine.server import ServerConfig, check_bind, serve
    from pyengine.server.errors import HTTPError
    from pyengine.server.registry import parse_keep_alive

    try:
        keep_alive = parse_keep_alive(args.keep_alive)
    except HTTPError as exc:
        raise InvalidOptionError(exc.message.replace("'keep_alive'", "--keep-alive")) from None
    config = ServerConfig.with_env_key(
        host=args.host, port=args.port, models=tuple(args.models), parallel=args.parallel,
        max_queue=args.max_queue, api_key=args.api_key, insecure=args.insecure,
        cors_origins=tuple(args.cors_origins), n_ctx=args.ctx, n_threads=args.threads,
        keep_alive_s=keep_alive, max_body_bytes=args.max_body_mb * 1024 * 1024,
        mmproj=args.mmproj, remote_images=args.allow_remote_images,
        draft_model=args.draft_model, speculative=args.speculative,
    )
    if args.mmproj and not args.models:
        raise InvalidOptionError("--mmproj goes with --model: it is the first model's projector")
    if args.draft_model and not args.models:
        raise InvalidOptionError("--draft-model goes with --model: it drafts for the first model")
    if args.speculative == "draft" and not args.draft_model:
        raise InvalidOptionError("--speculative draft needs --draft-model")
    check_bind(config)  # before pulling anything
    _use_kv_type(args)
    if args.ray:
        return _serve_on_ray(config, args)
    if args.address or args.autoscale or args.replicas != 1:
        raise InvalidOptionError("--address, --replicas and --autoscale go with --ray")
    print(f"pyengine serving on http://{_url_host(config.host)}:{config.port}", file=sys.stderr, flush=True)
    serve(config)
    return EXIT_OK


def _serve_on_ray(config, args) -> int:
    from pyengine.errors import InvalidOptionError

    try:
        from pyengine.serve import ray as on_ray
    except ImportError as exc:
        raise InvalidOptionError(f'--ray needs Ray Serve: pip install "pyengine[ray]" ({exc})') from None
    autoscale = on_ray.parse_autoscale(args.autoscale) if args.autoscale else None
    print(f"pyengine serving on Ray at http://{_url_host(config.host)}:{config.port}", file=sys.stderr, flush=True)
    on_ray.serve_cluster(config, address=args.address, replicas=args.replicas, autoscale=autoscale)
    return EXIT_OK


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _add_bench(commands) -> None:
    sub = commands.add_parser(
        "bench", help="measure prompt and generation speed",
        description="Measure prompt processing and generation speed in tokens/s.",
    )
    sub.add_argument("model", metavar="NAME|PATH", help="model name (or hf.co/OWNER/REPO:TAG) or path to a .gguf file")
    sub.add_argument("--threads", type=_int_at_least(1), default=None,
                     help="worker threads (default: physical cores)")
    sub.add_argument("--prompt-tokens", type=_int_at_least(1), default=512, help="default 512")
    sub.add_argument("--gen-tokens", type=_int_at_least(1), default=128, help="default 128")
    sub.add_argument("--repeat", type=_int_at_least(1), default=3,
                     help="runs per measurement, best kept (default 3)")
    sub.add_argument("--depth", type=_int_at_least(0), default=0,
                     help="tokens of context in the cache before each measurement (llama-bench's -d; default 0)")
    _add_speculative(sub)
    _add_kv_type(sub)
    sub.set_defaults(handler=_cmd_bench)


def _cmd_bench(args) -> int:
    from pyengine import store

    path = store.resolve_model(args.model, pull=True, progress=True)
    from pyengine.bench import run_bench

    _use_kv_type(args)
    result = run_bench(
        str(path), n_threads=args.threads, n_prompt=args.prompt_tokens,
        n_gen=args.gen_tokens, repeat=args.repeat, n_depth=args.depth, **_speculation(args),
    )
    at = f" @ d{args.depth}" if args.depth else ""
    _print_table(None, [
        ("model", str(result["model"])),
        ("threads", str(result["n_threads"])),
        ("isa", str(result["isa"])),
        ("devices", "; ".join(result["devices"])),
        (f"prompt (pp{args.prompt_tokens}{at})", f"{result['pp_tps']:.1f} tokens/s"),
        (f"generation (tg{args.gen_tokens}{at})", f"{result['tg_tps']:.1f} tokens/s"),
        ("python per token", f"{result['py_us_per_token']:.1f} us"),
        *_speculative_rows(result),
        ("load time", f"{result['load_s']:.2f} s"),
        ("first token", f"{result['first_token_s']:.2f} s after load started"),
        ("peak memory", f"{result['peak_rss_mb']:.0f} MiB (model file {result['model_mb']:.0f} MiB)"),
    ])
    return EXIT_OK


def _speculative_rows(result: dict) -> list[tuple[str, str]]:
    if not result.get("speculative"):
        return []
    return [(f"speculative ({result['speculative']}, tg{result['n_gen']})",
             f"{result['spec_tg_tps']:.1f} tokens/s, {result['spec_acceptance']:.0%} of drafts accepted")]


# --------------------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------------------


def _print_table(header: tuple[str, ...] | None, rows: list[tuple[str, ...]]) -> None:
    lines = ([header] if header else []) + list(rows)
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths)]
        print("  ".join(cells).rstrip())


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _silence_stdout() -> None:
    import os

    # Python flushes stdout at exit; point it at devnull so that flush cannot fail again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
