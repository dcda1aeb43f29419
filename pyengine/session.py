"""Chatting with an `LLM`: render, tokenize, generate, parse, and shape the reply.

    from pyengine.session import chat, create_chat_completion
    reply = chat(llm, [{"role": "user", "content": "Hi"}])            # Ollama /api/chat shape
    print(reply["message"]["content"])
    for chunk in create_chat_completion(llm, messages, stream=True):  # OpenAI chunks
        print(chunk["choices"][0]["delta"].get("content", ""), end="")

Both take options by Ollama's names (``temperature``, ``top_k``, ``num_predict``,
``num_ctx``, ``stop``, ``seed``, ...). The conversation is rendered with the model's
own chat template (``think`` switches reasoning on or off where the template has a
switch), the reply is split into reasoning, content and tool calls (tool calls are
parsed only when ``tools`` are given, in the format the template teaches), and
``format`` ("json" or a JSON schema) constrains the answer (gpt-oss then answers in
the final channel its prompt opens, without reasoning first).

Lower level: :func:`start_chat` / :func:`start_prompt` return a :class:`ChatStream`
of :class:`ChatPiece` events ending with a :class:`ChatResult`; the server uses these.
"""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Iterator, Sequence

from pyengine.chat import capabilities, fim, shapes
from pyengine.chat.harmony import FINAL_OPENER, harmony_call_header, opened_header
from pyengine.chat.messages import normalize_messages, normalize_tools
from pyengine.chat.parsers import HARMONY, Delta, collect, make_parser, prompt_opens_reasoning, reply_format
from pyengine.chat.prompt import encode_rendered, model_template
from pyengine.chat.template import ChatTemplate, takes_reasoning_effort, thinking_kwargs
from pyengine.chat.tool_choice import (
    forced_arguments_grammar,
    forced_call_grammar,
    forced_parse_format,
    forced_syntax,
    read_tool_choice,
)
from pyengine.errors import InvalidOptionError, UnsupportedError
from pyengine.generation import submit
from pyengine.runner.sequence import Completion

THINK_LEVELS = ("low", "medium", "high")
_TEMPLATES: "weakref.WeakKeyDictionary[Any, ChatTemplate]" = weakref.WeakKeyDictionary()
_CAPABILITIES: "weakref.WeakKeyDictionary[Any, tuple[str, ...]]" = weakref.WeakKeyDictionary()


# --------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedPrompt:
    """Token ids to generate after, and how to read the reply."""

    ids: list[int]
    text: str | None = None            # the rendered prompt, when there was one
    tool_format: str | None = None     # parse tool calls in this format (None: not at all)
    starts_in_reasoning: bool = False  # the prompt opened a reasoning block
    parse: bool = True                 # split reasoning/tool calls (False: raw text)
    stops: tuple[str, ...] = ()        # the template's own stop texts, beside the request's
    forced_call: bool = False          # the reply is a forced tool call: it has no content
    images: tuple = ()                 # (start, rows): the prompt's images (pyengine.vision.prompt)


def chat_template(llm: Any) -> ChatTemplate:
    """The model's chat template (compiled once per LLM)."""
    try:
        return _TEMPLATES[llm]
    except (KeyError, TypeError):
        pass
    template = model_template(llm.gguf, llm.tokenizer)
    try:
        _TEMPLATES[llm] = template
    except TypeError:  # an object that cannot be weakly referenced: no caching
        pass
    return template


def use_template(llm: Any, source: str) -> ChatTemplate:
    """Render `llm`'s conversations with `source` instead of its file's template (a created
    model's TEMPLATE); its capabilities are then read from this one."""
    template = model_template(llm.gguf, llm.tokenizer, source=source)
    _TEMPLATES[llm] = template
    _CAPABILITIES.pop(llm, None)
    return template


def model_capabilities(llm: Any) -> tuple[str, ...]:
    """What the model can be asked to do (:mod:`pyengine.chat.capabilities`), computed once
    per LLM from its file, the template it is rendered with and its vocabulary."""
    try:
        return _CAPABILITIES[llm]
    except (KeyError, TypeError):
        pass
    found = capabilities.capabilities(llm.gguf.metadata, chat_template(llm).source, llm.tokenizer.vocab.special)
    try:
        _CAPABILITIES[llm] = found
    except TypeError:
        pass
    return found


def require_capabilities(llm: Any, *, route: str, tools: bool = False, think: Any = None,
                         insert: bool = False) -> None:
    """UnsupportedCapabilityError (400 on the server) for a request the model cannot serve:
    tools shown to a model whose template has none, reasoning asked of one without it, a
    suffix to fill in for a vocabulary without FIM tokens (see ``capabilities.require``)."""
    capabilities.require(model_name(llm), model_capabilities(llm), route=route, tools=tools, think=think,
                         insert=insert)


def prepare_infill(llm: Any, prefix: str, suffix: str, *, extra: Sequence[fim.ExtraChunk] = (),
                   prompt: str = "", n_ctx: int | None = None, n_predict: int | None = None) -> PreparedPrompt:
    """A fill-in-the-middle prompt, as llama.cpp's /infill builds it (:mod:`pyengine.chat.fim`);
    the reply is the middle, unparsed. No chat template applies: GGUF templates have no
    suffix slot (Ollama's .Suffix), the FIM tokens are what code models were trained on."""
    require_capabilities(llm, route="generate", insert=True)
    n_ctx = n_ctx or llm.n_ctx
    ids = fim.infill_ids(llm.tokenizer, prefix, suffix, extra=extra, prompt=prompt, n_ctx=n_ctx,
                         n_batch=min(fim.DEFAULT_BATCH, n_ctx), n_predict=n_predict if n_predict and n_predict > 0 else -1)
    return PreparedPrompt(ids, None, None, False, parse=False)


def prepare_chat(llm: Any, messages: Any, tools: Any = None, think: bool | str | None = None,
                 images: Any = None) -> PreparedPrompt:
    """Render `messages` (and `tools`) with the model's template and tokenize the result;
    images (in the messages or `images`) go where the template put them (pyengine.vision.prompt)."""
    from pyengine.vision import prompt as vision_prompt

    messages, blobs = vision_prompt.take_images(messages, images)
    projector = getattr(llm, "projector", None)
    if blobs and projector is None:
        raise UnsupportedError(f"{model_name(llm)} cannot take images (`images`, `image_url` parts): it was "
                               "loaded without a vision projector (LLM(..., mmproj=PATH))")
    conversation = normalize_messages(messages)
    tool_list = normalize_tools(tools)
    template = chat_template(llm)
    kwargs = _think_kwargs(template, think)
    text = template.render(conversation, tools=tool_list, add_generation_prompt=True, **kwargs)
    spans = []
    if blobs:
        def embed(data: bytes):   # in the engine's thread: the tower computes on the model's thread pool
            return llm.engine.call(lambda: projector.embed_pieces(data, llm.backend))

        ids, spans = vision_prompt.encode_with_images(
            llm.tokenizer, lambda piece: encode_rendered(llm.tokenizer, template, piece), text, blobs, projector,
            embed)
    else:
        ids = encode_rendered(llm.tokenizer, template, text)
    tool_format = reply_format(template.source, has_tools=bool(tool_list))
    return PreparedPrompt(ids, text, tool_format, prompt_opens_reasoning(text), stops=template.stops,
                          images=tuple(spans))


def prepare_prompt(llm: Any, prompt: str | Sequence[int], *, parse: bool = False) -> PreparedPrompt:
    """A raw prompt: text (special tokens parsed, BOS added as the model wants) or token ids."""
    if isinstance(prompt, str):
        ids = llm.tokenize(prompt, add_special=True, parse_special=True)
        text = prompt
    else:
        ids, text = _token_ids(llm, prompt), None
    if not ids:
        raise InvalidOptionError("the prompt is empty")
    opens = prompt_opens_reasoning(text) if (parse and text) else False
    return PreparedPrompt(ids, text, None, opens, parse)


def _think_kwargs(template: ChatTemplate, think: bool | str | None) -> dict:
    if think is None:
        return {}
    if isinstance(think, str):
        if think not in THINK_LEVELS:
            raise InvalidOptionError(f"think must be true, false or one of {THINK_LEVELS}, got {think!r}")
        kwargs = {"reasoning_effort": think} if takes_reasoning_effort(template.source) else {}
        return {**kwargs, **thinking_kwargs(template.source, True)}
    if not isinstance(think, bool):
        raise InvalidOptionError(f"think must be true, false or one of {THINK_LEVELS}, got {think!r}")
    kwargs = thinking_kwargs(template.source, think)
    if not kwargs and takes_reasoning_effort(template.source):
        # gpt-oss has levels, not a switch: true is its default level, false the lowest
        return {"reasoning_effort": "medium" if think else "low"}
    # A template without a switch is rendered as is: the model reasons (or not) on its own.
    return kwargs


def _token_ids(llm: Any, prompt: Sequence[int]) -> list[int]:
    ids = []
    for token in prompt:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < llm.n_vocab:
            raise InvalidOptionError(f"prompt token {token!r} is not a token id in [0, {llm.n_vocab})")
        ids.append(token)
    return ids


# --------------------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatPiece:
    """What one step of generation released: parsed deltas (content, reasoning or a
    whole tool call) and the log-probabilities of its tokens when they were asked for."""

    deltas: tuple[Delta, ...]
    logprobs: tuple | None = None

    def text(self, kind: str = "content") -> str:
        return "".join(delta.text for delta in self.deltas if delta.kind == kind)

    @property
    def tool_calls(self) -> list[dict]:
        return [delta.tool_call for delta in self.deltas if delta.kind == "tool_call" and delta.tool_call]


@dataclass
class ChatResult:
    """The whole reply, parsed, with its counts and timings."""

    content: str
    reasoning: str | None
    tool_calls: list[dict]
    finish_reason: str                 # "stop", "length", "tool_calls" or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    total_seconds: float = 0.0
    tokens: list[int] = field(default_factory=list)
    logprobs: list | None = None
    prompt_ids: list[int] = field(default_factory=list)
    stop_string: str | None = None     # the stop text that ended the reply, if one did
    forced_call: bool = False          # a forced tool call (cut off, it has neither content nor a call)
    speculative: str | None = None     # the request's speculative decoding ("ngram", "draft"), if any
    draft_tokens: int = 0              # drafted tokens verified, and those kept (runner/speculative.py)
    draft_accepted: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ChatStream:
    """A running reply: iterate it (``for`` or ``async for``) for ChatPiece events,
    the last event being the ChatResult; stopping early cancels the generation."""

    def __init__(self, handle: Any, prepared: PreparedPrompt) -> None:
        self._handle = handle
        self.prepared = prepared
        self.result: ChatResult | None = None
        self._parser = make_parser(reasoning=True, tool_format=prepared.tool_format,
                                   starts_in_reasoning=prepared.starts_in_reasoning,
                                   prompt=prepared.text) if prepared.parse else None
        self._deltas: list[Delta] = []
        self._t0 = time.perf_counter()

    def cancel(self) -> None:
        self._handle.cancel()

    def __iter__(self) -> Iterator[ChatPiece | ChatResult]:
        try:
            for event in self._handle:
                yield from self._convert(event)
        finally:
            if self.result is None:
                self._handle.cancel()

    def __aiter__(self) -> AsyncIterator[ChatPiece | ChatResult]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[ChatPiece | ChatResult]:
        try:
            async for event in self._handle:
                for out in self._convert(event):
                    yield out
        finally:
            if self.result is None:
                self._handle.cancel()

    def collect(self) -> ChatResult:
        """Run to the end; the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def _convert(self, event: Any) -> list[ChatPiece | ChatResult]:
        if isinstance(event, Completion):
            deltas = self._without_call_text(self._parser.finish()) if self._parser is not None else []
            out: list[ChatPiece | ChatResult] = [ChatPiece(tuple(deltas))] if deltas else []
            self._deltas.extend(deltas)
            self.result = self._result(event)
            return out + [self.result]
        text = getattr(event, "text", "") or ""
        logprobs = getattr(event, "logprobs", None) or None
        if self._parser is not None:
            deltas = self._without_call_text(self._parser.push(text)) if text else []
        else:
            deltas = [Delta("content", text)] if text else []
        self._deltas.extend(deltas)
        if not deltas and not logprobs:
            return []
        return [ChatPiece(tuple(deltas), tuple(logprobs) if logprobs else None)]

    def _without_call_text(self, deltas: list[Delta]) -> list[Delta]:
        """A forced call's text is never content: text that did not parse as the call is a
        call cut off by max_tokens (or a stop), and it is dropped rather than shown as markup."""
        if not self.prepared.forced_call:
            return deltas
        return [delta for delta in deltas if delta.kind != "content"]

    def _result(self, completion: Completion) -> ChatResult:
        parsed = collect(self._deltas)
        finish = completion.finish_reason
        if parsed.tool_calls and finish == "stop":
            finish = "tool_calls"
        return ChatResult(
            content=parsed.content, reasoning=parsed.reasoning, tool_calls=parsed.tool_calls,
            finish_reason=finish, prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens, prompt_seconds=completion.prompt_seconds,
            generation_seconds=completion.generation_seconds, total_seconds=time.perf_counter() - self._t0,
            tokens=list(completion.tokens), logprobs=getattr(completion, "logprobs", None),
            prompt_ids=list(self.prepared.ids), stop_string=getattr(completion, "stop_string", None),
            forced_call=self.prepared.forced_call, speculative=getattr(completion, "speculative", None),
            draft_tokens=getattr(completion, "draft_tokens", 0), draft_accepted=getattr(completion, "draft_accepted", 0),
        )


def start_prepared(llm: Any, prepared: PreparedPrompt, *, format: Any = None, surface: str = "ollama",
                   **options: Any) -> ChatStream:
    """Start generating after a prepared prompt (options by Ollama's names; those left out
    take `surface`'s defaults, see ``LLM.submit``)."""
    options = {name: value for name, value in options.items() if value is not None or name == "seed"}
    temperature = options.pop("temperature", None)
    if "num_predict" in options and "max_tokens" in options:
        raise InvalidOptionError("give num_predict or max_tokens (the same limit), not both")
    limit_name = "max_tokens" if "max_tokens" in options else "num_predict"   # OpenAI's name or Ollama's
    max_tokens = options.pop(limit_name, None)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise InvalidOptionError(f"option {limit_name!r} must be an integer, got {max_tokens!r}")
    if max_tokens is not None and max_tokens < 0:
        max_tokens = None  # Ollama's -1 (and -2): no limit of its own
    seed = options.pop("seed", None)
    stop = _with_template_stops(options.pop("stop", None), prepared.stops)
    if format not in (None, "", "text"):
        options["format"] = format
        prepared = _open_final_channel(llm, prepared)
    handle = submit(llm, prepared.ids, max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop,
                    surface=surface, images=prepared.images, **options)
    return ChatStream(handle, prepared)


def _open_final_channel(llm: Any, prepared: PreparedPrompt) -> PreparedPrompt:
    """A harmony prompt whose answer is constrained opens the final channel itself: the
    grammar (which applies from the first token) then writes the answer where the model
    writes answers, not in place of its channel headers. Its reasoning is skipped."""
    if prepared.tool_format != HARMONY or not prepared.text or opened_header(prepared.text) is not None:
        return prepared
    opener = llm.tokenizer.encode(FINAL_OPENER, add_special=False, parse_special=True)
    return replace(prepared, ids=[*prepared.ids, *opener], text=prepared.text + FINAL_OPENER)


def _harmony_forced_call(llm: Any, prepared: PreparedPrompt, function: dict) -> tuple[PreparedPrompt, Any]:
    """gpt-oss forced to call one function: the prompt writes the call's header, as the
    model would (harmony's markers are tokens no grammar writes), and the grammar its
    arguments; the reply is read as that message's body."""
    header = harmony_call_header(function["name"])
    ids = llm.tokenizer.encode(header, add_special=False, parse_special=True)
    prepared = replace(prepared, ids=[*prepared.ids, *ids], text=prepared.text + header, forced_call=True)
    return prepared, forced_arguments_grammar(function)


def _with_template_stops(stop: Any, template_stops: tuple[str, ...]) -> Any:
    """The request's stop texts (a string or a list, checked by the runner) and then the
    template's."""
    if not template_stops:
        return stop
    requested = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(requested, (list, tuple)):
        return stop   # not a stop list: the runner names the option in its error
    return [*requested, *(s for s in template_stops if s not in requested)]


def start_chat(llm: Any, messages: Any, tools: Any = None, format: Any = None, think: bool | str | None = None,
               tool_choice: Any = None, **options: Any) -> ChatStream:
    """Render, tokenize and start generating a reply to `messages`. `tool_choice` is
    OpenAI's: "required" or a named function forces the reply to be a tool call."""
    choice = read_tool_choice(tools, tool_choice)
    # a forced call needs no tools in the template: its grammar writes the call
    require_capabilities(llm, route="chat", tools=bool(choice.tools) and not choice.is_forced, think=think)
    prepared = prepare_chat(llm, messages, tools=choice.tools, think=think, images=options.pop("images", None))
    if choice.is_forced:
        if options.get("grammar") is not None:
            raise InvalidOptionError("a tool_choice that forces a call cannot be combined with option 'grammar'")
        if prepared.tool_format == HARMONY and len(choice.forced) == 1:
            prepared, options["grammar"] = _harmony_forced_call(llm, prepared, choice.forced[0])
        else:
            syntax = forced_syntax(prepared.tool_format)
            # the call starts at once (no reasoning first) and is read in the syntax forced
            prepared = replace(prepared, tool_format=forced_parse_format(syntax), starts_in_reasoning=False,
                               forced_call=True)
            options["grammar"] = forced_call_grammar(choice.forced, syntax)
        format = None  # the call's grammar is the reply's form
    return start_prepared(llm, prepared, format=format, **options)


# --------------------------------------------------------------------------------------
# The Python API: Ollama's chat shape and OpenAI's chat.completion shape
# --------------------------------------------------------------------------------------


def model_name(llm: Any) -> str:
    name = getattr(llm, "model_name", None)
    if isinstance(name, str) and name:
        return name
    return os.path.splitext(os.path.basename(str(llm.path)))[0]


def chat(llm: Any, messages: Any, tools: Any = None, format: Any = None, think: bool | str | None = None,
         stream: bool = False, **options: Any) -> dict | Iterator[dict]:
    """Reply to a conversation, in the shape of Ollama's ``/api/chat``.

    Returns ``{"model", "created_at", "message": {"role": "assistant", "content",
    "thinking"?, "tool_calls"?}, "done": True, "done_reason", "prompt_eval_count",
    "eval_count", ...}``, or with ``stream=True`` an iterator of such chunks (the last
    one with ``done`` True). Ollama's sampling defaults (temperature 0.8, top_k 40,
    top_p 0.9); ``temperature=0`` for greedy.
    """
    run = start_chat(llm, messages, tools=tools, format=format, think=think, **options)
    shaper = shapes.OllamaShaper(model_name(llm), kind="chat", token_bytes=llm.tokenizer.token_to_bytes)
    if stream:
        return _shaped_stream(run, shaper.piece, lambda result: [shaper.final(result, streamed=True)])
    return shaper.final(run.collect(), streamed=False)


def create_chat_completion(
    llm: Any,
    messages: Any,
    *,
    tools: Any = None,
    tool_choice: Any = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    typical_p: float | None = None,
    stream: bool = False,
    stop: str | Sequence[str] | None = None,
    seed: int | None = None,
    response_format: Any = None,
    max_tokens: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    repeat_penalty: float | None = None,
    mirostat_mode: int | None = None,
    mirostat_tau: float | None = None,
    mirostat_eta: float | None = None,
    model: str | None = None,
    logit_bias: dict | None = None,
    logprobs: bool | None = None,
    top_logprobs: int | None = None,
    think: bool | str | None = None,
    stream_options: dict | None = None,
    **options: Any,
) -> dict | Iterator[dict]:
    """An OpenAI ``chat.completion`` (or, streaming, ``chat.completion.chunk`` dicts),
    with llama-cpp-python's parameters and defaults (temperature 0.2, top_p 0.95, top_k 40,
    min_p 0.05, no penalty; None is a parameter left out, where the model file's
    ``general.sampling.*`` comes first); extra options by Ollama's names."""
    sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
                    presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                    repeat_penalty=repeat_penalty, mirostat=mirostat_mode, mirostat_tau=mirostat_tau,
                    mirostat_eta=mirostat_eta, seed=seed, stop=stop, logit_bias=logit_bias,
                    num_predict=max_tokens)
    if logprobs:
        sampling.update(logprobs=True, top_logprobs=top_logprobs or 0)
    run = start_chat(llm, messages, tools=tools, format=response_format_to_format(response_format), think=think,
                     tool_choice=tool_choice, **{"surface": "llama-cpp-python-chat", **sampling, **options})
    shaper = shapes.OpenAIChatShaper(model or model_name(llm), token_bytes=llm.tokenizer.token_to_bytes)
    if stream:
        include_usage = bool((stream_options or {}).get("include_usage"))
        return _shaped_stream(run, shaper.chunk, lambda result: shaper.final_chunks(result, include_usage),
                              head=shaper.first_chunk())
    return shaper.response(run.collect())


def apply_tool_choice(tools: Any, tool_choice: Any) -> Any:
    """The tools the prompt shows under OpenAI's tool_choice ("none" hides them); whether
    the reply must call one is :func:`~pyengine.chat.tool_choice.read_tool_choice`'s."""
    return read_tool_choice(tools, tool_choice).tools


def response_format_to_format(response_format: Any) -> Any:
    """OpenAI's response_format as the `format` option: None, "json" or a JSON schema."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise InvalidOptionError("response_format must be an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")  # llama-cpp-python's extension
        return schema if isinstance(schema, dict) and schema else "json"
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidOptionError("response_format.json_schema must be an object with a 'schema'")
        schema = spec.get("schema", {})
        if not isinstance(schema, (dict, bool)):
            raise InvalidOptionError("response_format.json_schema.schema must be a JSON schema object")
        return schema if schema not in ({}, True) else "json"
    raise InvalidOptionError(f"response_format.type must be text, json_object or json_schema, got {kind!r}")


def _shaped_stream(run: ChatStream, on_piece, on_result, head: dict | None = None) -> Iterator[dict]:
    if head is not None:
        yield head
    for event in run:
        if isinstance(event, ChatResult):
            yield from on_result(event)
        else:
            chunk = on_piece(event)
            if chunk is not None:
                yield chunk


__all__ = [
    "ChatPiece",
    "ChatResult",
    "ChatStream",
    "PreparedPrompt",
    "apply_tool_choice",
    "chat",
    "chat_template",
    "create_chat_completion",
    "model_capabilities",
    "model_name",
    "use_template",
    "prepare_chat",
    "prepare_infill",
    "prepare_prompt",
    "require_capabilities",
    "response_format_to_format",
    "start_chat",
    "start_prepared",
]
