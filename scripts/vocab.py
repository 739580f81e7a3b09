"""llama.cpp's Qwen3.5 vocabulary file (and other files of llama.cpp's `models/`), fetched
once from the pinned llama-cpp-python sdist.

`ggml-vocab-qwen35.gguf` (llama.cpp, MIT) is a vocabulary-only GGUF: the real tokenizer and
chat template of the Qwen3.5 family, without weights. The benchmark models and the grammar
tests need it, and it ships inside the llama-cpp-python sdist that warmslot pins, so the one
reproducible way to have it is to take it out of that sdist:

    from vocab import qwen35_vocab
    path = qwen35_vocab()   # ~/.cache/warmslot/ggml-vocab-qwen35.gguf ($WARMSLOT_CACHE_DIR)

The first call looks for the sdist (or its extracted tree) on disk, else downloads it with
`pip download` (which goes through pip's own index settings), extracts only this member and
checks its sha256; later calls return the cached copy. Run as a script it prints the path.
`llama_cpp_file(member)` does the same for the other files of `LLAMA_CPP_FILES` (vocabularies
and real chat templates, which the template-family test models are made of).
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
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
VOCAB_NAME = "ggml-vocab-qwen35.gguf"
VOCAB_MEMBER = f"vendor/llama.cpp/models/{VOCAB_NAME}"
VOCAB_SHA256 = "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c"
# other files of the sdist's vendor/llama.cpp/models/ that tests use, with their sha256
LLAMA_CPP_FILES = {
    "ggml-vocab-llama-bpe.gguf": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "ggml-vocab-llama-spm.gguf": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "templates/Qwen-Qwen3-0.6B.jinja": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
    "templates/Qwen3.5-4B.jinja": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
    "templates/meta-llama-Llama-3.1-8B-Instruct.jinja": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "templates/unsloth-mistral-Devstral-Small-2507.jinja": "039a4710e2aabaa79e85a233fa3daa4fbc030a4a8dc218cb7f34fb0c4b8c13b1",
}
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
    """$WARMSLOT_CACHE_DIR, else ~/.cache/warmslot: outside the repository, shared by worktrees."""
    return Path(os.environ.get("WARMSLOT_CACHE_DIR") or Path.home() / ".cache" / "warmslot")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Wanted:
    """A file of the sdist: its path inside it (below the top folder) and its sha256."""

    member: str
    sha256: str

    @property
    def name(self) -> str:
        return Path(self.member).name


def qwen35_vocab() -> Path:
    """The verified cached copy of ggml-vocab-qwen35.gguf, fetched on first use."""
    return _fetch(Wanted(VOCAB_MEMBER, VOCAB_SHA256))


def llama_cpp_file(name: str) -> Path:
    """The verified cached copy of vendor/llama.cpp/models/`name` (one of LLAMA_CPP_FILES)."""
    return _fetch(Wanted(f"vendor/llama.cpp/models/{name}", LLAMA_CPP_FILES[name]))


def _fetch(wanted: Wanted) -> Path:
    target = cache_dir() / wanted.name
    if target.is_file() and sha256_of(target) == wanted.sha256:
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VocabUnavailable(f"cannot create the cache folder {target.parent}: {exc}") from exc
    errors = []
    for source in (_copy_from_extracted_tree, _extract_from_local_sdist, _extract_from_downloaded_sdist):
        try:
            if source(target, wanted):
                return target
        except (OSError, tarfile.TarError, subprocess.SubprocessError, VocabUnavailable) as exc:
            errors.append(f"{source.__name__}: {exc}")
    raise VocabUnavailable(f"could not get {wanted.name} from llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}'s "
                           f"sdist:\n  " + "\n  ".join(errors or ["no source found"]))


def _install(source: BinaryIO, target: Path, wanted: Wanted) -> bool:
    """Write the bytes to a temporary file beside `target`, check the hash, then rename it in:
    concurrent test runs never see a partial or unverified file."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{wanted.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out)
        got = sha256_of(Path(tmp))
        if got != wanted.sha256:
            raise VocabUnavailable(f"sha256 {got} differs from the recorded {wanted.sha256}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _copy_from_extracted_tree(target: Path, wanted: Wanted) -> bool:
    for tree in EXTRACTED_DIRS:
        path = tree / wanted.member
        if path.is_file():
            with open(path, "rb") as source:
                return _install(source, target, wanted)
    return False


def _extract_member(tarball: Path, target: Path, wanted: Wanted) -> bool:
    """Read only the wanted member out of the sdist (whatever its top folder is called)."""
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith("/" + wanted.member):
                return _install(tar.extractfile(member), target, wanted)
    raise VocabUnavailable(f"{tarball} has no {wanted.member}")


def _extract_from_local_sdist(target: Path, wanted: Wanted) -> bool:
    found = [Path(p) for pattern in SDIST_GLOBS for p in sorted(glob.glob(pattern))]
    return _extract_member(found[0], target, wanted) if found else False


def _extract_from_downloaded_sdist(target: Path, wanted: Wanted) -> bool:
    with tempfile.TemporaryDirectory(prefix="warmslot-sdist-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        tarballs = sorted(Path(tmp).glob("llama*cpp*python-*.tar.gz"))
        if done.returncode != 0 or not tarballs:
            raise VocabUnavailable(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
        return _extract_member(tarballs[0], target, wanted)


if __name__ == "__main__":
    print(qwen35_vocab())
