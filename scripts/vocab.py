"""llama.cpp's Qwen3.5 vocabulary file, fetched once from the pinned llama-cpp-python sdist.

`ggml-vocab-qwen35.gguf` (llama.cpp, MIT) is a vocabulary-only GGUF: the real tokenizer and
chat template of the Qwen3.5 family, without weights. The benchmark models and the grammar
tests need it, and it ships inside the llama-cpp-python sdist that warmslot pins, so the one
reproducible way to have it is to take it out of that sdist:

    from vocab import qwen35_vocab
    path = qwen35_vocab()   # ~/.cache/warmslot/ggml-vocab-qwen35.gguf ($WARMSLOT_CACHE_DIR)

The first call looks for the sdist (or its extracted tree) on disk, else downloads it with
`pip download` (which goes through pip's own index settings), extracts only this member and
checks its sha256; later calls return the cached copy. Run as a script it prints the path.

Other files of llama.cpp's `models/` folder come the same way, several in one pass: the
tests' template families take vocabularies and chat templates from it
(`sdist_files([llama_cpp_file("templates/Qwen3.5-4B.jinja", SHA256)])`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from dataclasses import dataclass
from typing import BinaryIO

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
VOCAB_NAME = "ggml-vocab-qwen35.gguf"
VOCAB_MEMBER = f"vendor/llama.cpp/models/{VOCAB_NAME}"
VOCAB_SHA256 = "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
REPO_ROOT = Path(__file__).resolve().parent.parent

# Where an sdist or its extracted tree may already be: scripts/build_llama_server.sh's build/,
# and pip's unpack folders of an earlier source install.
SDIST_GLOBS = (
    str(REPO_ROOT / "build" / "sdist" / f"{SDIST_NAME}.tar.gz"),
    f"{tempfile.gettempdir()}/pip-unpack-*/{SDIST_NAME}.tar.gz",
)
EXTRACTED_DIRS = (REPO_ROOT / "build" / "src" / SDIST_NAME,)


class VocabUnavailable(RuntimeError):
    """The vocabulary file could not be found, downloaded or verified."""


def cache_dir() -> Path:
    """$WARMSLOT_CACHE_DIR, else ~/.cache/warmslot: outside the repository, shared by worktrees.
    Created here, on first use (a fresh machine has neither folder); concurrent callers are safe."""
    folder = Path(os.environ.get("WARMSLOT_CACHE_DIR") or Path.home() / ".cache" / "warmslot")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class SdistFile:
    """A file of llama.cpp's tree inside the pinned sdist, checked by its hash."""

    name: str  # the file's name in the cache folder
    member: str  # its path inside the sdist, below the sdist's top folder
    sha256: str


def llama_cpp_file(name: str, sha256: str) -> SdistFile:
    """A file of the vendored llama.cpp's models/ folder (its vocabularies and templates/)."""
    return SdistFile(name.replace("/", "-"), f"vendor/llama.cpp/models/{name}", sha256)


def qwen35_vocab() -> Path:
    """The verified cached copy of ggml-vocab-qwen35.gguf, fetched on first use."""
    return sdist_files([SdistFile(VOCAB_NAME, VOCAB_MEMBER, VOCAB_SHA256)])[0]


def sdist_files(files: list[SdistFile]) -> list[Path]:
    """The verified cached copies of `files`, those missing taken out of the sdist in one
    pass (a local sdist or tree, else one `pip download`)."""
    targets = [cache_dir() / f.name for f in files]
    missing = [(f, t) for f, t in zip(files, targets) if not (t.is_file() and sha256_of(t) == f.sha256)]
    if not missing:
        return targets
    try:
        targets[0].parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VocabUnavailable(f"cannot create the cache folder {targets[0].parent}: {exc}") from exc
    errors = []
    for source in (_copy_from_extracted_tree, _extract_from_local_sdist, _extract_from_downloaded_sdist):
        try:
            if source(missing):
                return targets
        except (OSError, tarfile.TarError, subprocess.SubprocessError, VocabUnavailable) as exc:
            errors.append(f"{source.__name__}: {exc}")
    names = ", ".join(f.name for f, _ in missing)
    raise VocabUnavailable(f"could not get {names} from llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}'s "
                           f"sdist:\n  " + "\n  ".join(errors or ["no source found"]))


def _install(source: BinaryIO, target: Path, sha256: str) -> bool:
    """Write the bytes to a temporary file beside `target`, check the hash, then rename it in:
    concurrent test runs never see a partial or unverified file."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out)
        got = sha256_of(Path(tmp))
        if got != sha256:
            raise VocabUnavailable(f"{target.name}: sha256 {got} differs from the recorded {sha256}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


Missing = list[tuple[SdistFile, Path]]


def _copy_from_extracted_tree(missing: Missing) -> bool:
    for tree in EXTRACTED_DIRS:
        if all((tree / f.member).is_file() for f, _ in missing):
            for f, target in missing:
                with open(tree / f.member, "rb") as source:
                    _install(source, target, f.sha256)
            return True
    return False


def _extract_members(tarball: Path, missing: Missing) -> bool:
    """Read only the wanted members out of the sdist (whatever its top folder is called)."""
    wanted = {"/" + f.member: (f, target) for f, target in missing}
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            key = member.name[member.name.find("/"):] if "/" in member.name else ""
            if member.isfile() and key in wanted:
                f, target = wanted.pop(key)
                _install(tar.extractfile(member), target, f.sha256)
    if wanted:
        raise VocabUnavailable(f"{tarball} has no {', '.join(f.member for f, _ in wanted.values())}")
    return True


def _extract_from_local_sdist(missing: Missing) -> bool:
    found = [Path(p) for pattern in SDIST_GLOBS for p in sorted(glob.glob(pattern))]
    return _extract_members(found[0], missing) if found else False


def _extract_from_downloaded_sdist(missing: Missing) -> bool:
    with tempfile.TemporaryDirectory(prefix="warmslot-sdist-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        tarballs = sorted(Path(tmp).glob("llama*cpp*python-*.tar.gz"))
        if done.returncode != 0 or not tarballs:
            raise VocabUnavailable(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
        return _extract_members(tarballs[0], missing)


if __name__ == "__main__":
    print(qwen35_vocab())
