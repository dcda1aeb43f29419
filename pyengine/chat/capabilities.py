"""What a model can be asked to do, as Ollama reports and checks it.

Ollama's ``/api/show`` lists a model's capabilities and its routes refuse a request
that needs one the model lacks, with 400 ``"<model>" does not support <capability>``.
The rules, read off the file and the chat template pyengine renders with:

* ``completion``: every decoder; ``embedding`` instead for an embedding model
  (``pyengine.embedding.is_embedding_model``: the file declares a pooling type, as
  Ollama tells them apart, or the architecture has no LM head).
  It lists nothing else. Decoders still embed through ``/api/embed`` by mean pooling;
  they do not list it.
* ``tools``: the chat template reads the ``tools`` variable (Ollama looks for the same
  variable in its templates): a template that never shows the tools cannot teach them.
* ``thinking``: the template has a reasoning switch (``enable_thinking``, ...) or writes
  a reasoning block's opening and closing markers (``<think>``/``</think>``, ...), the way
  Ollama infers the tags from its template.
* ``insert`` (fill-in-the-middle): the vocabulary has FIM prefix, suffix and middle
  tokens (llama.cpp's ``/infill`` check; GGUF Jinja templates have no ``suffix`` variable).
* ``vision``: a projector is loaded (pyengine loads none yet, so it is never listed).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jinja2
import jinja2.meta

from pyengine.chat.parsers import REASONING_MARKERS
from pyengine.chat.sandbox import GuardedEnvironment
from pyengine.chat.template import supports_thinking
from pyengine.embedding import is_embedding_model
from pyengine.errors import UnsupportedCapabilityError

COMPLETION = "completion"
TOOLS = "tools"
THINKING = "thinking"
INSERT = "insert"
EMBEDDING = "embedding"
VISION = "vision"
FIM_NAMES = ("fim_pre", "fim_suf", "fim_mid")


def capabilities(metadata: Mapping[str, Any], template: str, special: Mapping[str, int | None], *,
                 has_projector: bool = False) -> tuple[str, ...]:
    """The capabilities of a model: its GGUF `metadata`, the chat `template` source it is
    rendered with and its vocabulary's `special` ids (``Vocab.special``), in Ollama's order."""
    if is_embedding_model(metadata):
        return (EMBEDDING,)   # tools, thinking and insert are kinds of text it does not write
    found = [COMPLETION]
    found += template_capabilities(template or "")
    if all(special.get(name) is not None for name in FIM_NAMES):
        found.append(INSERT)
    if has_projector:
        found.append(VISION)
    return tuple(found)


@functools.lru_cache(maxsize=64)
def template_capabilities(template: str) -> tuple[str, ...]:
    """``tools`` and ``thinking`` as a chat template shows them."""
    found = []
    if TOOLS in _variables(template):
        found.append(TOOLS)
    if supports_thinking(template) or any(opener in template and closer in template
                                          for opener, closer in REASONING_MARKERS):
        found.append(THINKING)
    return tuple(found)


def _variables(template: str) -> frozenset[str]:
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(GuardedEnvironment().parse(template)))
    except jinja2.TemplateError:  # unparsable: the names it mentions at all
        return frozenset(name for name in (TOOLS,) if name in template)


def require(model: str, have: tuple[str, ...], *, route: str = "generate", tools: bool = False,
            think: Any = None, insert: bool = False) -> None:
    """Raise UnsupportedCapabilityError for the first capability a request needs and the
    model lacks: text from an embedding model (worded by its `route`, "generate" or
    "chat", as Ollama words it), `tools` shown to the model, `think` true or a level
    (false or None asks for nothing), a suffix to fill in before (`insert`)."""
    if COMPLETION not in have:
        raise UnsupportedCapabilityError(model, COMPLETION, route)
    wanted = [(TOOLS, tools), (THINKING, think not in (None, False)), (INSERT, insert)]
    for capability, needed in wanted:
        if needed and capability not in have:
            raise UnsupportedCapabilityError(model, capability)


__all__ = ["COMPLETION", "EMBEDDING", "INSERT", "THINKING", "TOOLS", "VISION", "capabilities", "require",
           "template_capabilities"]
