"""Slot files: `POST /slots/{id}?action=save|restore|erase` (with --slot-save-path).

The same contract as llama-server's: a JSON body with `filename` (a plain file name inside
--slot-save-path) for save and restore; answers `{id_slot, filename, n_saved, n_written,
timings: {save_ms}}`, `{id_slot, filename, n_restored, n_read, timings: {restore_ms}}` and
`{id_slot, n_erased}`. With API keys, only the admin key may act on slots (403). Saved files
together stay within --slot-save-size (507 past it); a name longer than the file system
takes is a 400 that shows no path. An action on a busy slot waits until its request is done. Files are
the disk tier's verified format, written atomically; a file that fails verification (another
model or layout, truncated, damaged, not a slot file) is refused with a 400 naming the reason
and counted in `warmslot_disk_cache_rejected_total`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from warmslot.cache.disk import Meta, Rejected
from warmslot.cache.disk import format as fmt
from warmslot.slots import slot_files

from ..errors import ApiError, Forbidden, InvalidRequest, NotSupported, Unavailable
from ..request.json_body import parse_body
from ..state import ModelHost, named_model

log = logging.getLogger("warmslot.server")

BUSY_WAIT_S = 300.0  # how long an action waits for a busy slot
_POLL_S = 0.05


async def slot_action(request: Request) -> Response:
    host = named_model(request, request.query_params.get("model"))  # several models: ?model=NAME
    # NOTE: a slot holds any tenant's conversation: saving, restoring or erasing it is the
    # admin key's (the only key that sees every tenant on /slots)
    if not host.server.is_admin(host.server.authorize(request)):
        raise Forbidden("slot actions need the admin key (--admin-key, else the first --api-key)")
    if not host.config.slot_save_path:
        raise NotSupported("This server does not support slots action. Start it with `--slot-save-path`")
    host.require_ready()
    try:
        slot_id = int(request.path_params["id_slot"])
    except ValueError:
        raise InvalidRequest("Invalid slot ID", param="id_slot") from None
    action = request.query_params.get("action", "")
    if action == "erase":
        n = await _on_slot(host, lambda engine: slot_files.erase(engine, slot_id))
        return JSONResponse({"id_slot": slot_id, "n_erased": n})
    if action not in ("save", "restore"):
        raise InvalidRequest("Invalid action: use save, restore or erase", param="action")
    filename = parse_body(await request.body()).get("filename")
    if not isinstance(filename, str) or not valid_filename(filename):
        raise InvalidRequest("Invalid filename", param="filename")
    longest = longest_filename(host.config.slot_save_path)
    if len(filename.encode("utf-8")) > longest:
        raise InvalidRequest(f"Invalid filename: at most {longest} bytes on this server's file system", param="filename")
    path = os.path.join(host.config.slot_save_path, filename)
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    if action == "save":
        img = await _on_slot(host, lambda engine: slot_files.image(engine, slot_id))
        meta = Meta(host.engine.info.state_fingerprint, img.tenant, img.prompt_end, time.time())
        await loop.run_in_executor(None, _check_quota, host.config, filename, _image_bytes(img))
        try:
            header = await loop.run_in_executor(
                None, fmt.write, host.config.slot_save_path, filename, meta, img.tokens, img.state, img.checkpoints
            )
        except OSError as exc:  # NOTE: str(exc) names the server's path; the reason alone does not
            raise ApiError(f"Unable to save slot: {exc.strerror or type(exc).__name__}") from None
        if _saved_bytes(host.config.slot_save_path) > host.config.slot_save_size:  # the estimate fell short
            await loop.run_in_executor(None, _remove, path)
            raise _over_quota(host.config)
        return JSONResponse({
            "id_slot": slot_id, "filename": filename, "n_saved": len(img.tokens), "n_written": header.file_bytes,
            "timings": {"save_ms": (time.perf_counter() - t0) * 1000},
        })
    try:
        header, payload = await loop.run_in_executor(None, fmt.read, path)
        if header.base is not None:
            raise Rejected("base", "a disk-tier segment: it holds only the cells after the entry it continues")
    except Rejected as exc:
        host.server.slot_file_rejected[exc.reason] += 1
        log.warning("slot file %s refused (%s)", filename, exc)
        raise InvalidRequest(f"Unable to restore slot: {exc}", param="filename", code=f"slot_file_{exc.reason}") from None
    if header.meta.fingerprint != host.engine.info.state_fingerprint:
        host.server.slot_file_rejected["model"] += 1
        log.warning("slot file %s refused: saved by another model or state layout", filename)
        raise InvalidRequest("Unable to restore slot: the file was saved by another model or state layout",
                             param="filename", code="slot_file_model")
    n = await _on_slot(host, lambda engine: slot_files.restore(engine, slot_id, header, payload))
    return JSONResponse({
        "id_slot": slot_id, "filename": filename, "n_restored": n, "n_read": header.file_bytes,
        "timings": {"restore_ms": (time.perf_counter() - t0) * 1000},
    })


async def _on_slot(host: ModelHost, fn):
    """Run fn on the engine thread once its slot is idle (polling between steps)."""
    deadline = time.monotonic() + BUSY_WAIT_S
    loop = asyncio.get_running_loop()
    while True:
        future = host.engine.call(fn)
        try:
            return await asyncio.wrap_future(future, loop=loop)
        except slot_files.SlotBusy:
            if time.monotonic() > deadline:
                raise Unavailable("the slot stayed busy", retry_after=5) from None
            await asyncio.sleep(_POLL_S)
        except slot_files.SlotActionError as exc:
            raise InvalidRequest(str(exc)) from None


class InsufficientStorage(ApiError):
    """507: the slot files would pass --slot-save-size."""

    status = 507
    type = "insufficient_storage"


TEMP_NAME_EXTRA = 14  # fmt.write's temporary ".{name}.{8 hex}.tmp" is this much longer


def longest_filename(directory: str) -> int:
    """Bytes a slot file's name may have: the file system's limit less the temporary name's
    extra (a longer one failed with ENAMETOOLONG, naming the server's path)."""
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    return min(255, limit) - TEMP_NAME_EXTRA


def _image_bytes(img) -> int:
    """About what the file of a slot image takes (state, tokens and checkpoints)."""
    checkpoints = sum(c.nbytes for c in img.checkpoints)
    return int(img.state.nbytes) + 4 * len(img.tokens) + checkpoints


def _saved_bytes(directory: str) -> int:
    total = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def _check_quota(config, filename: str, n_bytes: int) -> None:
    """Raise 507 when the directory plus this file (less the file it replaces) would pass
    --slot-save-size."""
    directory = config.slot_save_path
    replaced = os.path.join(directory, filename)
    existing = os.path.getsize(replaced) if os.path.isfile(replaced) else 0
    if _saved_bytes(directory) - existing + n_bytes > config.slot_save_size:
        raise _over_quota(config)


def _over_quota(config) -> InsufficientStorage:
    return InsufficientStorage(
        f"Unable to save slot: the slot files would pass their quota of {config.slot_save_size} bytes "
        "(--slot-save-size); erase some, or restore over an existing name", code="slot_save_quota",
    )


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


_FORBIDDEN = set('/\\:*?"<>|') | {"\ufffd", "\ufeff", "\uff0e", "\u2215", "\u2216"}


def valid_filename(name: str) -> bool:
    """A plain file name, by llama-server's rules: no path separators or characters that are
    illegal on some systems, no control characters, no '..', no leading or trailing space,
    no trailing '.', at most 255 bytes."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255:
        return False
    for ch in name:
        cp = ord(ch)
        if cp <= 0x1F or cp == 0x7F or 0x80 <= cp <= 0x9F or 0xD800 <= cp <= 0xDFFF or ch in _FORBIDDEN:
            return False
    if name[0] == " " or name[-1] in (" ", "."):
        return False
    return ".." not in name and name != "."
