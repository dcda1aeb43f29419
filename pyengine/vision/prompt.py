"""Images in a chat: taken out of the messages, marked in the rendered prompt, and
placed in the token sequence as the projector's rows.

Messages carry images as Ollama does (`"images": [base64, ...]` beside the content)
or as OpenAI does (content parts `{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}`); `images=` on the call attaches more to the last
user turn.  Each image becomes MARKER in the text the template renders (Ollama's
images before the turn's text, OpenAI's where the part was); the rendered prompt is
cut at the markers, each piece tokenized alone (as llama.cpp's mtmd does), and
each image put in as its tower's pieces: text, and one placeholder position per
image token of each row block (Gemma 3: <start_of_image> ... <end_of_image>; a
tiling tower such as Idefics3's has a block per tile with text between them).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence

import numpy as np

from pyengine.errors import ImageError, InvalidOptionError

MARKER = "<__media__>"   # llama.cpp's default media marker
PLACEHOLDER = 0          # the token id an image position holds in the prompt (never embedded)
IMAGE_PART_TYPES = ("image_url", "input_image", "image")


def take_images(messages, images=None) -> tuple[list, list]:
    """(messages with MARKER where each image was, the images as given - bytes, base64 or
    data: URIs, read by encode_with_images - in prompt order)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        return messages, []   # normalize_messages says what is wrong
    messages = list(messages)
    if images:   # the call's images go first in the last user turn, as Ollama's would
        last = next((i for i in range(len(messages) - 1, -1, -1)
                     if isinstance(messages[i], Mapping) and messages[i].get("role") == "user"), None)
        if last is None:
            raise InvalidOptionError("images need a user message to go with")
        messages[last] = {**messages[last], "images": [*images, *(messages[last].get("images") or ())]}
    out, found = [], []
    for message in messages:
        if not isinstance(message, Mapping):
            out.append(message)
            continue
        message = dict(message)
        before = list(message.pop("images", None) or ())   # Ollama's: before the turn's text
        content, in_parts = message.get("content"), []
        if isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
            content = [_marked_part(part, in_parts) for part in content]
        if before:
            marks = MARKER * len(before)
            content = marks + (content or "") if isinstance(content, (str, type(None))) else \
                [{"type": "text", "text": marks}, *content]
        if before or in_parts:
            message["content"] = content
        found += before + in_parts
        out.append(message)
    return out, found


def _marked_part(part, found: list[bytes]):
    """A content part, or MARKER as a text part in place of an image part (its image to `found`)."""
    if isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES:
        found.append(_part_ref(part))
        return {"type": "text", "text": MARKER}
    return part


def _part_ref(part: Mapping):
    ref = part.get("image_url", part.get("image"))
    if isinstance(ref, Mapping):
        ref = ref.get("url")
    if ref is None and isinstance(part.get("url"), str):
        ref = part["url"]
    return ref


def _image_bytes(value) -> bytes:
    """An image given as bytes, base64 text or a data: URI."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if not isinstance(value, str):
        raise ImageError(f"an image must be bytes, base64 text or a data: URI, got {type(value).__name__}")
    text = value.strip()
    if text.startswith("data:"):
        head, _, text = text.partition(",")
        if ";base64" not in head:
            raise ImageError("a data: URI image must be base64-encoded")
    elif text.startswith(("http://", "https://", "file:")):
        raise ImageError("images by URL are not fetched: send the image itself (base64 or a data: URI)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("an image is not valid base64") from None


def encode_with_images(tokenizer, encode_first, text: str, blobs: list, projector,
                       embed=None) -> tuple[list[int], list[tuple[int, np.ndarray]]]:
    """(token ids with placeholders, [(start, rows)]) of a rendered prompt whose MARKERs
    stand for `blobs` (as take_images gives them) in order; `encode_first(piece)`
    tokenizes the first piece (BOS as the template wants), later pieces go without it.
    `embed(image bytes) -> pieces` runs the projector (default: projector.embed_pieces
    here): the image's text and row blocks in prompt order, each block its own span."""
    pieces = text.split(MARKER)
    if len(pieces) - 1 != len(blobs):
        raise InvalidOptionError(f"the chat template dropped images: {len(blobs)} given, "
                                 f"{len(pieces) - 1} in the prompt")

    def encode(s: str) -> list[int]:
        return tokenizer.encode(s, add_special=False, parse_special=True) if s else []

    ids = list(encode_first(pieces[0]))
    spans = []
    for blob, piece in zip(blobs, pieces[1:]):
        for part in (embed or projector.embed_pieces)(_image_bytes(blob)):
            if isinstance(part, str):
                ids += encode(part)
            else:
                spans.append((len(ids), part))
                ids += [PLACEHOLDER] * (part.size // part.shape[-1])   # rows, or a grid [rows, columns, n_embd]
        ids += encode(piece)
    return ids, spans
