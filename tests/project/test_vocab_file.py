"""scripts/vocab.py takes the vocabulary out of an sdist, checks its hash and caches it (no network)."""

import hashlib
import io
import tarfile

import pytest

from scripts import vocab

CONTENT = b"GGUF not really a vocabulary"


@pytest.fixture
def fake_release(tmp_path, monkeypatch):
    """The module pointed at a made-up sdist whose member has CONTENT, and no download."""
    monkeypatch.setenv("WARMSLOT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(vocab, "VOCAB_SHA256", hashlib.sha256(CONTENT).hexdigest())
    monkeypatch.setattr(vocab, "EXTRACTED_DIRS", (tmp_path / "extracted",))
    monkeypatch.setattr(vocab, "SDIST_GLOBS", (str(tmp_path / "sdist" / "*.tar.gz"),))

    def no_download(missing):
        raise vocab.VocabUnavailable("no network in this test")

    monkeypatch.setattr(vocab, "_extract_from_downloaded_sdist", no_download)
    return tmp_path


def write_sdist(path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in ((f"{vocab.SDIST_NAME}/README.md", b"readme"),
                           (f"{vocab.SDIST_NAME}/{vocab.VOCAB_MEMBER}", content)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_taken_from_a_local_sdist_then_cached(fake_release):
    write_sdist(fake_release / "sdist" / f"{vocab.SDIST_NAME}.tar.gz", CONTENT)
    path = vocab.qwen35_vocab()
    assert path == fake_release / "cache" / vocab.VOCAB_NAME and path.read_bytes() == CONTENT
    (fake_release / "sdist" / f"{vocab.SDIST_NAME}.tar.gz").unlink()
    assert vocab.qwen35_vocab() == path  # from the cache now


def test_a_file_with_the_wrong_hash_is_refused_and_not_kept(fake_release):
    write_sdist(fake_release / "sdist" / f"{vocab.SDIST_NAME}.tar.gz", b"something else")
    with pytest.raises(vocab.VocabUnavailable, match="sha256"):
        vocab.qwen35_vocab()
    assert list((fake_release / "cache").iterdir()) == []


def test_no_source_at_all_says_so(fake_release):
    with pytest.raises(vocab.VocabUnavailable, match="no network in this test"):
        vocab.qwen35_vocab()
