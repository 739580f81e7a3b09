"""The README and docs/ document what the code does: every flag, every metric, and the commands
CI runs; their links hold."""

import pathlib
import re

from warmslot.server.process.flag_values import parse_size
from warmslot.server.process.flags import FLAGS, NOOP, OFF, ON, SIZE

README = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
FLAG_REFERENCE = (pathlib.Path(__file__).parents[2] / "docs" / "flags.md").read_text()
METRICS_PAGE = (pathlib.Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
TABLE_HEAD = "\n| flag | default | meaning |\n|---|---|---|\n"


def flag_table(text: str = FLAG_REFERENCE) -> dict[tuple[str, ...], str]:
    """A flag table (docs/flags.md's, or the README's short one): each spelling of a flag (the
    names of one `-x, --xx` span) and the default its row states. A row may hold several flags,
    `a` / `b`, with defaults `x` / `y` (or one default for all)."""
    rows = text.split(TABLE_HEAD, 1)[1].split("\n\n", 1)[0]
    table = {}
    for line in rows.splitlines():
        names, default, _meaning = (cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1])
        groups, defaults = names.split(" / "), default.split(" / ")
        if len(defaults) != len(groups):
            defaults = [default] * len(groups)
        for group, stated in zip(groups, defaults):
            for span in re.findall(r"`([^`]+)`", group):
                table[tuple(name.strip() for name in span.split(","))] = stated
    return table


def _in_reference(flag) -> tuple[tuple[str, ...], str]:
    """docs/flags.md's spelling of a flag (names that are all its own, its first long one among
    them) and the default stated for it."""
    long = next(name for name in flag.names if name.startswith("--"))
    found = [(names, stated) for names, stated in flag_table().items() if long in names]
    assert len(found) == 1, f"{long}: {len(found)} rows of docs/flags.md's flag table"
    names, stated = found[0]
    assert set(names) <= set(flag.names), f"{names}: not the names of {flag.names}"
    return names, stated


def test_every_flag_is_in_the_flag_reference():
    for flag in FLAGS:
        _in_reference(flag)
    table_names = {name for flag in FLAGS for name in flag.names} | {"--version"}
    for names in flag_table():
        assert set(names) <= table_names, f"docs/flags.md's flag table names a flag that is not one: {names}"


def test_the_flag_reference_states_each_flags_default():
    """The default column says the table's default: its `default_text`, else the value
    (`8080`, `8MiB`; numbers and sizes compared as values), none for an unset one, off or on
    for a switch, nothing for a flag accepted only for compatibility."""
    for flag in FLAGS:
        names, stated = _in_reference(flag)
        if flag.default_text is not None:
            expected = flag.default_text
        elif flag.kind == NOOP:
            expected = ""
        elif flag.kind is bool:
            expected = "on" if flag.default else "off"
        elif flag.kind in (ON, OFF):
            expected = flag.default
        elif flag.default is None:
            expected = "none"
        else:
            value = re.fullmatch(r"`([^`]+)`( \(MiB\))?", stated)
            assert value, f"{names}: docs/flags.md states {stated!r}, not the value {flag.default!r}"
            read = {SIZE: parse_size, int: float, float: float}.get(flag.kind, str)
            assert read(value.group(1)) == read(flag.default), (
                f"{names}: docs/flags.md {stated!r}, table {flag.default!r}")
            continue
        assert stated == expected, f"{names}: docs/flags.md {stated!r}, table {expected!r}"


def test_the_readme_flags_are_rows_of_the_reference():
    """The README's short table of the flags used most repeats docs/flags.md's rows word for word."""
    rows = README.split(TABLE_HEAD, 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(rows) >= 5
    reference = set(FLAG_REFERENCE.splitlines())
    stale = [row for row in rows if row not in reference]
    assert not stale, f"README rows that differ from docs/flags.md: {stale}"


def test_readme_has_the_two_setup_commands():
    for marker in ("<!-- run-command -->", "<!-- test-command -->"):
        block = README.split(marker, 1)[1]
        command = re.search(r"```bash\n(.+)\n```", block).group(1)
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && . scripts/build_flags.sh && pip install")
    assert "&& warmslot" in README.split("<!-- run-command -->", 1)[1].split("```")[1]
    assert README.split("<!-- test-command -->", 1)[1].split("```")[1].strip().endswith("&& pytest")


def test_grafana_dashboard_uses_documented_metrics():
    """Every metric the Grafana dashboard plots is one that docs/metrics.md documents."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text()
    names = set(re.findall(r"warmslot_[a-z_]+", text))
    assert len(names) > 10
    for name in names:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert base in METRICS_PAGE, name


def test_every_package_folder_is_installed():
    """A wheel holds only the packages pyproject.toml lists: every folder with an __init__.py
    under server/, slots/ and cache/ must be there (editable installs would hide a gap)."""
    import tomllib

    root = pathlib.Path(__file__).parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "warmslot." + ".".join(init.parent.relative_to(root).parts)
        for top in ("server", "slots", "cache")
        for init in (root / top).rglob("__init__.py")
    }
    assert found == listed


def test_the_llama_server_flag_list_matches_the_catalog():
    from warmslot.server.process.llama_flags import markdown

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "llama-server-flags.md").read_text()
    assert doc == markdown(), "regenerate docs/llama-server-flags.md from warmslot.server.process.llama_flags.markdown()"


# -- links between the README and docs/ ---------------------------------------------------------

ROOT = pathlib.Path(__file__).parents[2]
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
    out, seen = set(), {}
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
    """(target file, anchor) of every relative link in a markdown file."""
    out = []
    for target in LINK.findall(path.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        out.append(((path.parent / file).resolve() if file else path.resolve(), anchor))
    return out


def test_every_link_in_the_docs_resolves():
    """Every relative link of the README and docs/ names a file that exists, and every anchor a
    heading of its file (the README's sections that the flag table and docs/ point into)."""
    broken = []
    for md in MARKDOWN:
        for target, anchor in _links(md):
            if not target.exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{md.relative_to(ROOT)} -> {target.name}#{anchor}")
    assert not broken, broken


def test_every_benchmark_result_is_linked():
    """Every file under docs/benchmarks/ is linked from the README or a page of docs/, so no
    result lies there that no page explains."""
    linked = {target for md in MARKDOWN for target, _ in _links(md)}
    files = [p.resolve() for p in (ROOT / "docs" / "benchmarks").rglob("*") if p.is_file()]
    unlinked = sorted(str(p.relative_to(ROOT.resolve())) for p in files if p not in linked)
    assert not unlinked, unlinked


def test_paths_the_docs_cite_exist():
    """A path of the repository written in the README or docs/ (`server/api/chat/route.py`)
    names a file or folder that exists: the docs follow the code when it moves."""
    cited = re.compile(r"`((?:server|slots|cache|scripts|tests|docs)/[\w./-]*)`")
    missing = []
    for md in MARKDOWN:
        for path in cited.findall(md.read_text()):
            if not (ROOT / path.rstrip("/")).exists():
                missing.append(f"{md.relative_to(ROOT)}: {path}")
    assert not missing, missing
