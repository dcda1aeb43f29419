"""One loaded model as the server sees it: :class:`ModelAdapter`.

The routes never touch an `LLM` directly; they ask an adapter to start a reply and
get a :class:`~pyengine.chat.session.ChatStream` back. Tests swap in a fake adapter
with the same methods to make timing deterministic.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from pyengine.chat import session
from pyengine.server.config import ServerConfig


class ModelAdapter:
    """Starts replies of one LLM; the only server code that calls into it."""

    def __init__(self, name: str, path: Path, llm: Any) -> None:
        self.name = name
        self.path = Path(path)
        self.llm = llm

    @classmethod
    def load(cls, name: str, path: Path, config: ServerConfig) -> "ModelAdapter":
        from pyengine.api import LLM

        kwargs: dict[str, Any] = {"n_ctx": config.n_ctx, "n_threads": config.n_threads}
        if "n_parallel" in inspect.signature(LLM).parameters:  # the batching engine
            kwargs["n_parallel"] = config.parallel
        return cls(name, path, LLM(str(path), **kwargs))

    # ---- what the routes call ----------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.llm.n_ctx

    def token_bytes(self, token: int) -> bytes:
        return self.llm.tokenizer.token_to_bytes(token)

    def start_chat(self, messages: Any, *, tools: Any = None, tool_choice: Any = None, format: Any = None,
                   think: Any = None, options: dict) -> session.ChatStream:
        return session.start_chat(self.llm, messages, tools=tools, tool_choice=tool_choice, format=format,
                                  think=think, **options)

    def start_generate(self, prompt: str, *, system: str | None = None, raw: bool = False,
                       context: Sequence[int] | None = None, format: Any = None, think: Any = None,
                       options: dict) -> session.ChatStream:
        """Ollama's /api/generate: the prompt as one user turn (or raw), after `context`."""
        if raw:
            prepared = session.prepare_prompt(self.llm, prompt, parse=True)
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + \
                       [{"role": "user", "content": prompt}]
            prepared = session.prepare_chat(self.llm, messages, think=think)
        if context:
            ids = session.prepare_prompt(self.llm, list(context)).ids + prepared.ids
            prepared = replace(prepared, ids=ids, tool_format=None, parse=True)
        return session.start_prepared(self.llm, prepared, format=format, **options)

    def start_completion(self, prompt: str | list[int], *, format: Any = None,
                         options: dict) -> session.ChatStream:
        """OpenAI's /v1/completions: the prompt as is, the reply unparsed."""
        prepared = session.prepare_prompt(self.llm, prompt, parse=False)
        return session.start_prepared(self.llm, prepared, format=format, **options)

    def embed(self, inputs: list[str] | list[list[int]], *, normalize: bool = True,
              truncate: bool = True) -> tuple[list[list[float]], int]:
        """Pooled embeddings of the inputs and the number of tokens they took."""
        return self.llm.embed(inputs, normalize=normalize, truncate=truncate, return_count=True)

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids)

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if callable(close):
            close()


__all__ = ["ModelAdapter"]
