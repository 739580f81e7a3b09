"""docs/flags.md is made from the flag table: it fails here when a flag, a default or a word
changed in server/process/flags.py or flags_doc.py and the page was not written again."""

import pathlib

import pytest

from warmslot.server.process import flags_doc
from warmslot.server.process.flags import FLAGS, Flag

PAGE = pathlib.Path(__file__).parents[2] / "docs" / "flags.md"


def test_docs_flags_md_is_what_the_flag_table_makes():
    assert PAGE.read_text() == flags_doc.flags_markdown(), (
        f"docs/flags.md is stale: regenerate it with `{flags_doc.COMMAND}` from the repository root"
    )


def test_every_flag_has_its_words(monkeypatch):
    """A flag added to the table without a row of flags_doc.ROWS stops the page from being made,
    naming the flag."""
    extra = Flag(("--brand-new-flag",), "brand_new_flag", bool, False, sets="port")
    monkeypatch.setattr(flags_doc, "FLAGS", [*FLAGS, extra])
    with pytest.raises(ValueError, match="brand-new-flag"):
        flags_doc.flags_markdown()


def test_the_command_writes_the_page(tmp_path):
    out = tmp_path / "flags.md"
    assert flags_doc.main([str(out)]) == 0
    assert out.read_text() == flags_doc.flags_markdown()
