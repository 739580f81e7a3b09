"""`-hf USER/REPO[:QUANT]`: a GGUF model from the Hugging Face Hub, as llama-server fetches it.

huggingface_hub does the work: it lists the repository, downloads into its cache
(`HF_HOME`, `HF_HUB_CACHE`) with a progress bar, resumes, and honours `HF_TOKEN` and
`HF_ENDPOINT`. A file already in the cache is used without downloading it again, and when the
Hub cannot be reached the cached files of the repository are used.

Which file: `--hf-file` names it; otherwise the GGUF whose name carries the quant
(case-insensitive, default Q4_K_M), else the first GGUF of the repository. Projector files
(mmproj) are never chosen as the model. A model split into parts (`-00001-of-00003.gguf`) is
downloaded whole and the first part is loaded (llama.cpp finds the others next to it).

The projector: as llama-server does, a GGUF with "mmproj" in its name in the model's folder
or one above it is downloaded beside the model (`choose_projector`), unless --no-mmproj or
--mmproj gives one.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

log = logging.getLogger("warmslot")

DEFAULT_QUANT = "Q4_K_M"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


class HubError(RuntimeError):
    """The model could not be found or downloaded."""


@dataclass(frozen=True, slots=True)
class HubModel:
    repo: str
    quant: str | None  # asked for (None: the default)

    @classmethod
    def parse(cls, spec: str) -> "HubModel":
        repo, _, quant = spec.strip().partition(":")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise HubError(f"-hf wants USER/REPO[:QUANT], e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M, not {spec!r}")
        return cls(repo, quant or None)


def choose_file(files: list[str], quant: str | None) -> str:
    """The GGUF to load among a repository's files (see the module docstring)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower().rsplit("/", 1)[-1])
    ggufs = [f for f in ggufs if not _SPLIT.search(f) or _SPLIT.search(f).group(1) == "00001"]
    if not ggufs:
        raise HubError("the repository has no GGUF file")
    wanted = (quant or DEFAULT_QUANT).lower()
    pattern = re.compile(rf"(^|[^a-z0-9]){re.escape(wanted)}([^a-z0-9]|$)")
    for name in ggufs:
        if pattern.search(name.rsplit("/", 1)[-1].lower()):
            return name
    if quant is not None:
        raise HubError(f"no GGUF file for quant {quant!r}; the repository has: {', '.join(ggufs)}")
    return ggufs[0]


def choose_projector(files: list[str], model: str) -> str | None:
    """The repository's projector for `model` (None: it has none): a GGUF named *mmproj* in
    the model's folder or one above it, the nearest folder first, then the precision closest
    to the model's (bits: Q4 4, Q8 8, F16 and BF16 16, F32 32)."""
    folder = model.split("/")[:-1]
    best = None
    for f in files:
        parts = f.split("/")
        if not f.lower().endswith(".gguf") or "mmproj" not in parts[-1].lower() or parts[:-1] != folder[: len(parts) - 1]:
            continue
        key = (-(len(parts) - 1), abs(_bits(parts[-1]) - _bits(model.split("/")[-1])), f)
        best = min(best, key) if best else key
    return best[2] if best else None


def _bits(name: str) -> int:
    match = re.search(r"(?:^|[^a-z0-9])(?:i?q|b?f)(\d+)", name.lower())
    return int(match.group(1)) if match else 16


def split_parts(filename: str) -> list[str]:
    """All parts of a split GGUF (just the file when it is not split)."""
    match = _SPLIT.search(filename)
    if not match:
        return [filename]
    total = int(match.group(2))
    stem = filename[: match.start()]
    return [f"{stem}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]


def download(spec: str, filename: str | None = None, token: str | None = None, *, projector: bool = False) -> tuple[str, str | None]:
    """The local paths of the model `spec` names and, with `projector`, of the repository's
    projector for it (None when it has none), downloaded into the Hub cache if needed."""
    import huggingface_hub

    log_once_through_root()
    model = HubModel.parse(spec)
    try:
        files, offline = _repo_files(model.repo, token) if projector or not filename else ([], False)
        name = filename or choose_file(files, model.quant)
        # NOTE: with the Hub unreachable, each download would retry for about 23 s before
        # falling back to the cache: once the listing found it so, read the cache at once
        paths = []
        for part in split_parts(name):
            log.info("model %s/%s: downloading into the Hugging Face cache if it is not there yet", model.repo, part)
            paths.append(huggingface_hub.hf_hub_download(model.repo, part, token=token, local_files_only=offline))
        mmproj = choose_projector(files, name) if projector else None
        mmproj_path = huggingface_hub.hf_hub_download(model.repo, mmproj, token=token, local_files_only=offline) if mmproj else None
    except HubError:
        raise
    except Exception as exc:  # noqa: BLE001 - network, HTTP and cache errors all end the start-up
        raise HubError(f"cannot get {spec}{' ' + filename if filename else ''} from Hugging Face: {exc}") from exc
    log.info("model %s/%s: %s", model.repo, name, paths[0])
    if mmproj:
        log.info("projector %s/%s: %s (--no-mmproj leaves it)", model.repo, mmproj, mmproj_path)
    return paths[0], mmproj_path


def log_once_through_root() -> None:
    """Let huggingface_hub's records (its retry warnings) print once.

    The library gives its root logger a handler of its own when imported and lets records
    propagate as well, so under the server's logging (a handler on the root logger) each one
    printed twice. Where the root logger has a handler, the library's own one goes.
    """
    import importlib

    importlib.import_module("huggingface_hub.utils.logging")  # its import adds the handler

    if not logging.getLogger().handlers:
        return
    library = logging.getLogger("huggingface_hub")
    for handler in list(library.handlers):
        library.removeHandler(handler)


def _repo_files(repo: str, token: str | None) -> tuple[list[str], bool]:
    """The repository's files, from the Hub, else from the cache when the Hub is unreachable;
    and whether it was (True: use the cache only)."""
    import huggingface_hub

    endpoint = huggingface_hub.constants.ENDPOINT
    # NOTE: the library retries a refused connection for about 23 s before it gives up; where
    # the host does not answer directly (and no proxy stands between) and the cache has the
    # repository, the cache is used at once
    if not _via_proxy() and not _reachable(endpoint):
        cached = _cached_files(repo)
        if cached:
            log.warning("cannot reach the Hub (%s does not answer); choosing among the cached files of %s", endpoint, repo)
            return cached, True
    try:
        return huggingface_hub.list_repo_files(repo, token=token), False
    except Exception as exc:  # noqa: BLE001 - offline, unreachable, refused: the cache may still have it
        cached = _cached_files(repo)
        if not cached:
            raise HubError(f"cannot list {repo} ({exc}) and nothing of it is cached") from exc
        log.warning("cannot reach the Hub (%s); choosing among the cached files of %s", exc, repo)
        return cached, True


def _via_proxy() -> bool:
    return any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"))


def _reachable(endpoint: str, timeout: float = 5.0) -> bool:
    """Whether the Hub's host accepts a connection (an unresolvable name or a refused or
    timed-out connection: no)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _cached_files(repo: str) -> list[str]:
    import huggingface_hub

    try:
        info = huggingface_hub.scan_cache_dir()
    except (huggingface_hub.CacheNotFound, OSError):
        return []
    return sorted({
        str(f.file_path.relative_to(revision.snapshot_path))
        for entry in info.repos if entry.repo_id == repo
        for revision in entry.revisions for f in revision.files
    })
