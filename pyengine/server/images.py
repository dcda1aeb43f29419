"""Images in server requests: remote image URLs, fetched only when the server was
started allowing them.

A remote fetch is bounded in size (read stops one byte past the limit) and in time
(one deadline over connecting and reading), so a slow or endless source costs the
request a 400, not a worker.  A message's data: URIs and base64 images are left for
pyengine.vision.prompt, which reads them.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from pyengine.server.errors import HTTPError
from pyengine.vision.image import MAX_BYTES
from pyengine.vision.prompt import IMAGE_PART_TYPES

FETCH_CHUNK = 64 * 1024


def remote_urls_fetched(messages: list, *, max_bytes: int = MAX_BYTES, timeout_s: float = 10.0) -> list:
    """`messages` with each http(s) image part's URL replaced by the fetched bytes."""
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            message = {**message, "content": [_fetched_part(part, max_bytes, timeout_s) for part in content]}
        out.append(message)
    return out


def _fetched_part(part, max_bytes: int, timeout_s: float):
    if not (isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES):
        return part
    ref = part.get("image_url", part.get("image"))
    url = ref.get("url") if isinstance(ref, Mapping) else ref
    if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        return part
    return {"type": "image", "image": fetch_image(url, max_bytes=max_bytes, timeout_s=timeout_s)}


def fetch_image(url: str, *, max_bytes: int, timeout_s: float) -> bytes:
    """The bytes at `url`; 400 past `max_bytes`, `timeout_s` or on any failure."""
    deadline = time.monotonic() + timeout_s
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "pyengine"}),
                                    timeout=timeout_s) as reply:
            declared = reply.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise _too_big(url, max_bytes)
            data = bytearray()
            while chunk := reply.read(FETCH_CHUNK):
                data += chunk
                if len(data) > max_bytes:
                    raise _too_big(url, max_bytes)
                if time.monotonic() > deadline:
                    raise HTTPError(400, f"fetching image {url} took more than {timeout_s:g} s", param="messages")
            return bytes(data)
    except HTTPError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HTTPError(400, f"could not fetch image {url}: {exc}", param="messages") from None


def _too_big(url: str, max_bytes: int) -> HTTPError:
    return HTTPError(400, f"image {url} is larger than {max_bytes} bytes", param="messages")


__all__ = ["fetch_image", "remote_urls_fetched"]
