"""Which models a server with several offers: `--models-dir` and `--models-file`, read into
`ModelSpec`s (a name, the patterns that pick it, its own flags), and the lookup of a
request's `model` among them.

A models folder is laid out as llama-server's `--models-dir`: a GGUF at the top is a model
named by its file (without `.gguf`); a subfolder holding GGUFs is a model named by the folder,
whose projector is the `mmproj*.gguf` beside it and whose model file is the other GGUF (the
first part, `-00001-of-`, of a split one).

A models file is INI, as llama-server's `--models-preset`: a section a model, named by the
section; its keys are the server's own flags without their leading dashes (`ctx-size = 8192`,
`c = 8192`, `parallel = 2`, `mmproj = ...`, a switch as `true` or `false`), plus `model` (its
GGUF; a section without it adds to the folder's model of the same name) and `keep-alive`. The
section `[*]` gives every model its flags. `alias` (the `-a` flag) lists other names, with
`fnmatch` wildcards (`claude-*haiku*`): a request's `model` is matched against every exact name
first, then against the wildcards in the file's order, the first that matches wins.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import re
from dataclasses import dataclass, field

from ..process.flags import FLAGS, NOOP, OFF, ON

SECTION_ALL = "*"
OWN_KEYS = ("model", "keep-alive")  # keys of a models file that are no flag
SWITCH_KINDS = (bool, NOOP, ON, OFF)
WILDCARDS = re.compile(r"[*?\[]")


class CatalogError(ValueError):
    """A models folder or file that cannot be served (the message names the model or key)."""


@dataclass
class ModelSpec:
    """One model a request may name: its path, the names and wildcards that pick it, its own
    flags (as a command line, after the server's) and how long it stays loaded while idle
    (None: the server's default)."""

    name: str
    path: str = ""
    patterns: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    keep_alive: float | None = None

    def __post_init__(self) -> None:
        assert self.name, "a model needs a name"


def read_models_dir(folder: str) -> list[ModelSpec]:
    """The models of a folder laid out as llama-server's `--models-dir`, sorted by name."""
    if not os.path.isdir(folder):
        raise CatalogError(f"--models-dir: not a folder: {folder}")
    specs = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.is_file() and _is_model_file(entry.name):
            specs.append(ModelSpec(entry.name[: -len(".gguf")], entry.path))
        elif entry.is_dir():
            spec = _folder_model(entry.path, entry.name)
            if spec is not None:
                specs.append(spec)
    return specs


def _is_model_file(name: str) -> bool:
    lower = name.lower()
    return lower.endswith(".gguf") and not lower.startswith("mmproj")


def _folder_model(path: str, name: str) -> ModelSpec | None:
    files = sorted(f for f in os.listdir(path) if f.lower().endswith(".gguf"))
    models = [f for f in files if _is_model_file(f)]
    if not models:
        return None
    first_parts = [f for f in models if re.search(r"-0*1-of-\d+\.gguf$", f)]
    spec = ModelSpec(name, os.path.join(path, (first_parts or models)[0]))
    projectors = [f for f in files if not _is_model_file(f)]
    if projectors:
        spec.args += ["--mmproj", os.path.join(path, projectors[0])]
    return spec


def read_models_file(path: str, known: list[ModelSpec]) -> list[ModelSpec]:
    """The models of an INI file and `known` (a folder's models), the file's sections adding
    flags and names to the folder's models of their name: the file's models in its order,
    then the folder's it does not name. Raises CatalogError."""
    parser = configparser.ConfigParser(interpolation=None, default_section="\0none")
    parser.optionxform = str  # keys as written
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as exc:
        raise CatalogError(f"--models-file: cannot read {path}: {exc}") from None
    common = _section_args(parser[SECTION_ALL], SECTION_ALL) if parser.has_section(SECTION_ALL) else []
    specs = {spec.name: spec for spec in known}
    for name in parser.sections():
        if name == SECTION_ALL:
            continue
        section = parser[name]
        spec = specs.get(name)
        if spec is None:
            if "model" not in section:
                raise CatalogError(f"--models-file: [{name}] names no model file (model = PATH)")
            spec = specs[name] = ModelSpec(name)
        if "model" in section:
            spec.path = os.path.expanduser(section["model"])
        if "keep-alive" in section:
            spec.keep_alive = parse_duration(section["keep-alive"], f"[{name}] keep-alive")
        spec.args += _section_args(section, name)
    named = [name for name in parser.sections() if name != SECTION_ALL]
    ordered = [specs[name] for name in named] + [spec for name, spec in specs.items() if name not in named]
    for spec in ordered:
        spec.args = common + spec.args
        if not os.path.isfile(spec.path):
            raise CatalogError(f"--models-file: [{spec.name}]: no such model file: {spec.path}")
    return ordered


def _section_args(section: configparser.SectionProxy, name: str) -> list[str]:
    """A section's flags as a command line (the flag table says which take no value)."""
    by_name = {n: flag for flag in FLAGS for n in flag.names}
    args: list[str] = []
    for key, value in section.items():
        if key in OWN_KEYS:
            continue
        flag_name = next((n for n in (f"--{key}", f"-{key}") if n in by_name), None)
        if flag_name is None:
            raise CatalogError(f"--models-file: [{name}] {key}: not a flag of warmslot")
        if by_name[flag_name].kind in SWITCH_KINDS:
            if value.strip().lower() not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
                raise CatalogError(f"--models-file: [{name}] {key} is a switch: true or false")
            if value.strip().lower() in ("true", "on", "1", "yes"):
                args.append(flag_name)
            continue
        args += [flag_name, value.strip()]
    return args


def parse_duration(text: str | float | int, what: str) -> float:
    """Seconds from Ollama's `keep_alive`: a number of seconds, or a duration such as "5m",
    "1h30m", "90s" (a negative value: forever, as `float('inf')`). Raises CatalogError."""
    if isinstance(text, bool):
        raise CatalogError(f"{what}: a number of seconds or a duration such as 5m")
    if isinstance(text, (int, float)):
        return float("inf") if text < 0 else float(text)
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        parts = re.fullmatch(r"(-)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", value)
        if not value or parts is None or not any(parts.groups()[1:]):
            raise CatalogError(f"{what}: a number of seconds or a duration such as 5m, not {text!r}") from None
        h, m, s = (float(g or 0) for g in parts.groups()[1:])
        seconds = (-1 if parts.group(1) else 1) * (h * 3600 + m * 60 + s)
    return float("inf") if seconds < 0 else seconds


class NameMatcher:
    """A request's `model` → a model's name: exact names first (each model's name and its
    aliases without wildcards), then the wildcards in catalog order; the first match wins."""

    def __init__(self, entries: list[tuple[str, list[str]]]) -> None:
        self.exact: dict[str, str] = {}
        self.wildcards: list[tuple[str, str]] = []
        for name, patterns in entries:
            self.exact.setdefault(name, name)
            for pattern in patterns:
                if WILDCARDS.search(pattern):
                    self.wildcards.append((pattern, name))
                else:
                    self.exact.setdefault(pattern, name)

    def match(self, wanted: str) -> str | None:
        """The model's name, or None (pure)."""
        if wanted in self.exact:
            return self.exact[wanted]
        for pattern, name in self.wildcards:
            if fnmatch.fnmatchcase(wanted, pattern):
                return name
        return None
