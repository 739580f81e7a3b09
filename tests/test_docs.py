"""The README documents what the code does: every flag, and the commands CI runs."""

import pathlib
import re

from warmslot.server.process.config import _FLAGS

README = (pathlib.Path(__file__).parent.parent / "README.md").read_text()


def test_every_flag_is_in_the_readme_table():
    for flags, _dest, _kind, _default, _help in _FLAGS:
        long = [f for f in flags if f.startswith("--")][0]
        assert f"`{long}" in README or f", {long}`" in README, long


def test_readme_has_the_two_setup_commands():
    for marker in ("<!-- run-command -->", "<!-- test-command -->"):
        block = README.split(marker, 1)[1]
        command = re.search(r"```bash\n(.+)\n```", block).group(1)
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && . scripts/build_flags.sh && pip install")
    assert "&& warmslot" in README.split("<!-- run-command -->", 1)[1].split("```")[1]
    assert README.split("<!-- test-command -->", 1)[1].split("```")[1].strip().endswith("&& pytest")


def test_grafana_dashboard_uses_documented_metrics():
    text = (pathlib.Path(__file__).parent.parent / "docs" / "grafana-dashboard.json").read_text()
    names = set(re.findall(r"warmslot_[a-z_]+", text))
    assert len(names) > 10
    for name in names:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert base in README, name


def test_every_package_folder_is_installed():
    """A wheel holds only the packages pyproject.toml lists: every folder with an __init__.py
    under server/, slots/ and cache/ must be there (editable installs would hide a gap)."""
    import tomllib

    root = pathlib.Path(__file__).parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "warmslot." + ".".join(init.parent.relative_to(root).parts)
        for top in ("server", "slots", "cache")
        for init in (root / top).rglob("__init__.py")
    }
    assert found == listed


def test_the_llama_server_flag_list_matches_the_catalog():
    from warmslot.server.process.llama_flags import markdown

    doc = (pathlib.Path(__file__).parent.parent / "docs" / "llama-server-flags.md").read_text()
    assert doc == markdown(), "regenerate docs/llama-server-flags.md from warmslot.server.process.llama_flags.markdown()"
