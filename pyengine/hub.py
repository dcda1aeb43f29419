"""Models on the Hugging Face Hub, named as Ollama names them: ``hf.co/OWNER/REPO:TAG``.

A name picks one GGUF file of a repository: ``TAG`` is the quantization written in
its file name (``Q4_K_M``, ``IQ4_XS``, ``Q8_0``, case-insensitive); without one,
``Q4_K_M``, or the repository's only quantization.  This module resolves a name to
the file (its URL, size and sha256, from the Hub's tree API: GGUF files are stored
through Git LFS, whose object id is the file's sha256) and opens Hub URLs; the store
(store.py) downloads, verifies and keeps the file.

``HF_ENDPOINT`` replaces https://huggingface.co (a mirror); ``HF_TOKEN`` (or
``HUGGING_FACE_HUB_TOKEN``) is sent to the Hub for gated and private repositories,
never to the storage hosts its downloads redirect to.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from pyengine.errors import StoreError

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_TAG = "Q4_K_M"
REVISION = "main"
TIMEOUT_S = 60.0            # per socket operation
MAX_TREE_PAGES = 50         # a listing longer than this is not a model repository

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_TAG = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_REF_RE = re.compile(rf"(?:hf\.co|huggingface\.co)/({_PART})/({_PART})(?::({_TAG}))?", re.IGNORECASE)
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class HubRef:
    """A repository and, when the name gives one, the quantization tag (upper case)."""

    owner: str
    repo: str
    tag: str | None

    @property
    def repo_id(self) -> str:
        return f"{self.owner}/{self.repo}"

    @property
    def name(self) -> str:
        """The canonical name: ``hf.co/OWNER/REPO[:TAG]``."""
        return f"hf.co/{self.repo_id}" + (f":{self.tag}" if self.tag else "")

    def with_tag(self, tag: str) -> HubRef:
        return HubRef(self.owner, self.repo, tag)


@dataclass(frozen=True)
class HubFile:
    """One GGUF file of a repository, as the tree API describes it."""

    path: str       # inside the repository
    url: str
    sha256: str
    size: int
    tag: str        # the quantization the store files it under

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def parse(name: str) -> HubRef | None:
    """The Hub reference ``name`` writes, or None when it is not one."""
    match = _REF_RE.fullmatch(name) if isinstance(name, str) else None
    if match is None or ".." in name or name.lower().endswith(".gguf"):
        return None
    owner, repo, tag = match.groups()
    return HubRef(owner, repo, normal_tag(tag) if tag and tag.lower() != "latest" else None)


def normal_tag(text: str) -> str | None:
    """A quantization tag in upper case, or None when ``text`` cannot be one."""
    return text.upper() if re.fullmatch(_TAG, text) and ".." not in text else None


def file_tag(path: str) -> str:
    """The quantization a GGUF file's name ends with (``...-Q4_K_M.gguf`` -> ``Q4_K_M``),
    upper case; the whole stem when the name has no separator."""
    stem = _SPLIT_RE.sub(".gguf", path.rsplit("/", 1)[-1])[: -len(".gguf")]
    return re.split(r"[-.]", stem)[-1].upper()


def _names_tag(path: str, tag: str) -> bool:
    """Whether the file's name carries ``tag`` as a whole ``-`` or ``.`` separated part."""
    stem = path.rsplit("/", 1)[-1][: -len(".gguf")].upper()
    return re.search(rf"(?:^|[-.]){re.escape(tag)}(?:$|[-.])", stem) is not None


def choose(ref: HubRef, entries: list[dict]) -> HubFile:
    """The file ``ref`` names among a repository's tree entries."""
    ggufs = [e for e in entries if _is_model_file(e)]
    if not ggufs:
        raise StoreError(f"{ref.repo_id} has no GGUF model files on the Hub")
    tags = sorted({file_tag(e["path"]) for e in ggufs})
    wanted = ref.tag or DEFAULT_TAG
    chosen = [e for e in ggufs if _names_tag(e["path"], wanted)]
    if not chosen and ref.tag is None and len(tags) == 1 and normal_tag(tags[0]) == tags[0]:
        chosen, wanted = ggufs, tags[0]   # the only quantization (its tag names it from now on)
    if not chosen:
        how = f"no {wanted} file" if ref.tag else f"no {DEFAULT_TAG} file, nor a single quantization to take"
        raise StoreError(f"{ref.repo_id} has {how}; name one of: "
                         + ", ".join(f"{ref.with_tag(t).name}" for t in tags))
    split = [e for e in chosen if _SPLIT_RE.search(e["path"])]
    if split:
        raise StoreError(f"{ref.with_tag(wanted).name} is split into {len(split)} files "
                         f"({split[0]['path']}, ...); split GGUF files are not supported yet")
    if len(chosen) > 1:
        raise StoreError(f"{ref.with_tag(wanted).name} matches several files: "
                         + ", ".join(e["path"] for e in chosen))
    return _hub_file(ref, chosen[0], wanted)


def choose_projector(ref: HubRef, entries: list[dict], tag: str) -> HubFile | None:
    """The repository's vision projector (an mmproj*.gguf file), if it has any: the one
    whose name carries the model's `tag`, else F16's, else the first by name."""
    found = sorted((e for e in entries if _is_projector_file(e)), key=lambda e: e["path"])
    if not found:
        return None
    best = next((e for want in (tag, "F16") for e in found if _names_tag(e["path"], want)), found[0])
    return _hub_file(ref, best, tag)


def _is_projector_file(entry: dict) -> bool:
    path = entry.get("path")
    return (entry.get("type") == "file" and isinstance(path, str) and path.lower().endswith(".gguf")
            and path.rsplit("/", 1)[-1].lower().startswith("mmproj"))


def _is_model_file(entry: dict) -> bool:
    path = entry.get("path")
    if entry.get("type") != "file" or not isinstance(path, str) or not path.lower().endswith(".gguf"):
        return False
    # vision projectors ride along in many repositories; they are no language model
    return not path.rsplit("/", 1)[-1].lower().startswith("mmproj")


def _hub_file(ref: HubRef, entry: dict, tag: str) -> HubFile:
    path, lfs = entry["path"], entry.get("lfs") or {}
    if any(part in ("", ".", "..") for part in path.split("/")) or "\\" in path:
        raise StoreError(f"the Hub lists an unsafe file name {path!r} in {ref.repo_id}")
    digest, size = lfs.get("oid"), entry.get("size")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
        raise StoreError(f"the Hub gives no sha256 for {path} in {ref.repo_id}; refusing an unverified file")
    if not isinstance(size, int) or size <= 0:
        raise StoreError(f"the Hub gives no size for {path} in {ref.repo_id}")
    quoted = urllib.parse.quote(path)
    url = f"{endpoint()}/{ref.repo_id}/resolve/{REVISION}/{quoted}"
    return HubFile(path, url, digest.lower(), size, tag)


# ---- the Hub's HTTP API ----------------------------------------------------------------


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


class _DropAuthOnRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects keep the token only on the Hub's own host: downloads are redirected to
    storage hosts whose signed URLs must not carry it."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def open_url(url: str):
    """A response for ``url`` with pyengine's user agent and, for the Hub, the token."""
    from pyengine import __version__

    headers = {"User-Agent": f"pyengine/{__version__}"}
    token = _token()
    if token and urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(endpoint()).netloc:
        headers["Authorization"] = f"Bearer {token}"
    opener = urllib.request.build_opener(_DropAuthOnRedirect)
    return opener.open(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)


def list_files(ref: HubRef) -> list[dict]:
    """Every entry of the repository's tree (the API pages long listings)."""
    url = f"{endpoint()}/api/models/{ref.repo_id}/tree/{REVISION}?recursive=true"
    entries: list[dict] = []
    for _ in range(MAX_TREE_PAGES):
        page, url = _read_tree_page(ref, url)
        entries += page
        if url is None:
            return entries
    raise StoreError(f"{ref.repo_id}'s file listing runs past {MAX_TREE_PAGES} pages")


def _read_tree_page(ref: HubRef, url: str) -> tuple[list[dict], str | None]:
    try:
        with open_url(url) as response:
            body, link = response.read(), response.headers.get("Link", "")
    except urllib.error.HTTPError as exc:
        raise StoreError(_http_error(ref, exc.code)) from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise StoreError(f"network error listing {ref.repo_id} on {endpoint()}: "
                         f"{getattr(exc, 'reason', None) or exc}") from exc
    try:
        page = json.loads(body)
        if not isinstance(page, list) or not all(isinstance(e, dict) for e in page):
            raise TypeError("not a list of objects")
    except (ValueError, TypeError) as exc:
        raise StoreError(f"the Hub's listing of {ref.repo_id} is not what its API returns: {exc}") from exc
    following = re.search(r'<([^>]+)>\s*;\s*rel="next"', link)
    return page, urllib.parse.urljoin(url, following.group(1)) if following else None


def _http_error(ref: HubRef, code: int) -> str:
    if code in (401, 403):
        hint = "set HF_TOKEN to a token that may read it" if _token() is None else "HF_TOKEN may not read it"
        return f"{ref.repo_id} is gated or private on the Hub (HTTP {code}): {hint}"
    if code == 404:
        return f"no repository {ref.repo_id} on {endpoint()}"
    return f"the Hub answered HTTP {code} for {ref.repo_id}"
