"""A model's own chat template, ready to render conversations for it."""

from __future__ import annotations

import os

from pyengine.chat.harmony import HARMONY_STOPS, is_harmony_template
from pyengine.chat.renderers import select_renderer
from pyengine.chat.template import ChatTemplate


def model_template(gguf, tokenizer, source: str | None = None) -> ChatTemplate:
    """The GGUF's `tokenizer.chat_template` (or `source`, when given), or else its family's
    prompt format (chosen from ``general.architecture`` and the vocabulary,
    :mod:`pyengine.chat.renderers`), with the model's BOS/EOS texts bound."""
    bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
    source = source or gguf.get_str("tokenizer.chat_template", "")
    if not source:
        renderer = select_renderer(gguf.architecture, tokenizer.vocab.token_to_id)
        return ChatTemplate.from_renderer(renderer, bos_token=bos, eos_token=eos)
    name = gguf.get_str("general.name", "") or os.path.basename(str(gguf.path))
    template = ChatTemplate(source, bos_token=bos, eos_token=eos, name=name)
    if is_harmony_template(source):
        # harmony ends a reply with <|return|> or <|call|>: stops also where the vocabulary
        # does not mark them end-of-generation
        template.stops = HARMONY_STOPS
    return template


def encode_rendered(tokenizer, template: ChatTemplate, text: str) -> list[int]:
    """Token ids of a rendered conversation: special tokens parsed, and BOS
    added only when the template did not already write it."""
    bos = template.bos_token
    add_special = not (bos and text.startswith(bos))
    return tokenizer.encode(text, add_special=add_special, parse_special=True)
