"""Deterministic pseudo-realistic text of a given size in tokens.

Text is built from lines of English words, code, logs, JSON and listings drawn from a seeded
random.Random (string seeds hash with SHA-512, so the text is the same on every machine and
Python run). It re-tokenizes stably: no random byte soup. Sizes in tokens are reached through
a chars-per-token ratio measured per kind on the first server's /tokenize.
"""

from __future__ import annotations

import json
import random

from .client import tokenize_text


WORDS = (
    "the request server client cache prompt token model slot context batch memory layer buffer "
    "state value record field index table query result error warning file path directory module "
    "function method class object string number list map key option setting flag config user "
    "agent tool call message history session output input stream event handler worker thread "
    "process queue task job schedule retry timeout limit budget size length offset count total "
    "update create delete read write open close start stop load save restore check verify test "
    "build deploy release version commit branch merge patch change diff review issue report "
    "network socket connection address port host proxy route endpoint service api response "
    "status code header body payload schema type format parse encode decode serialize validate "
    "returns accepts requires contains includes describes explains ensures handles supports "
    "quickly carefully safely always never usually often only also still already first last "
    "new old large small long short fast slow empty full valid invalid missing current previous "
    "next local remote shared private public internal external default custom primary secondary "
    "data source target storage database transaction lock snapshot backup migration replica "
    "metric latency throughput usage cost price order customer account invoice payment product"
).split()
NAMES = ("alpha beta gamma delta orion vega atlas nova helix quartz cobalt amber falcon harbor "
         "summit meadow river canyon ember willow").split()
EXTS = ("py", "ts", "go", "rs", "md", "json", "yaml", "toml", "sql", "sh")
DIRS = ("src", "src/server", "src/cache", "src/engine", "lib", "tests", "docs", "scripts", "config", "tools")
LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARNING", "INFO", "ERROR")


def random_words(rng: random.Random, lo: int, hi: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]


def random_sentence(rng: random.Random, lo: int = 7, hi: int = 18) -> str:
    w = random_words(rng, lo, hi)
    if len(w) > 6 and rng.random() < 0.3:
        w[len(w) // 2] += ","
    return " ".join(w).capitalize() + rng.choice((".", ".", ".", "!", "?") if rng.random() < 0.1 else ".")


def random_ident(rng: random.Random, parts: int | None = None) -> str:
    return "_".join(rng.choice(WORDS) for _ in range(parts or rng.randint(1, 3)))


def random_camel(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS).capitalize() for _ in range(rng.randint(1, 3)))


def random_path(rng: random.Random) -> str:
    return f"{rng.choice(DIRS)}/{random_ident(rng, rng.randint(1, 2))}.{rng.choice(EXTS)}"


def random_url(rng: random.Random) -> str:
    host = f"{rng.choice(NAMES)}-{rng.choice(WORDS)}.{rng.choice(('com', 'org', 'dev', 'io', 'net'))}"
    return f"https://{host}/{rng.choice(WORDS)}/{random_ident(rng, 2).replace('_', '-')}"


def _piece_prose(rng: random.Random, i: int) -> str:
    if rng.random() < 0.15:
        return f"\n## {' '.join(random_words(rng, 2, 5)).title()}\n\n"
    if rng.random() < 0.25:
        return "- " + random_sentence(rng, 5, 14) + "\n"
    return " ".join(random_sentence(rng) for _ in range(rng.randint(2, 4))) + "\n\n"


def _piece_code(rng: random.Random, i: int) -> str:
    fn, a, b, var, attr = random_ident(rng), random_ident(rng, 1), random_ident(rng, 2), random_ident(rng, 1), random_ident(rng, 1)
    body = [
        f"def {fn}({a}, {b}=None):",
        f'    """{random_sentence(rng, 6, 12)}"""',
        f"    {var} = {random_ident(rng)}({a}, {attr}={b})",
        f"    if {var} is None:",
        f'        raise ValueError("{" ".join(random_words(rng, 3, 7))}")',
        f"    for item in {var}.{attr}:",
        f"        if item.{random_ident(rng, 1)} > {rng.randint(0, 4096)}:",
        f"            {random_ident(rng, 1)}.append(item)",
        f"    return {var}",
        "",
    ]
    if rng.random() < 0.3:
        body = [f"class {random_camel(rng)}:", f'    """{random_sentence(rng, 6, 12)}"""', ""] + body
    return "".join(f"{(i * 11 + k) % 9999 + 1:6d}|{line}\n" for k, line in enumerate(body))


def _piece_log(rng: random.Random, i: int) -> str:
    ts = f"2025-03-{1 + i % 28:02d} {i % 24:02d}:{(i * 7) % 60:02d}:{(i * 13) % 60:02d},{(i * 37) % 1000:03d}"
    kv = " ".join(f"{rng.choice(WORDS)}={rng.randint(0, 99999)}" for _ in range(rng.randint(1, 3)))
    line = f"{ts} {rng.choice(LEVELS):7s} {rng.choice(NAMES)}.{random_ident(rng, 1)}: {' '.join(random_words(rng, 4, 10))} {kv}\n"
    if rng.random() < 0.08:
        line += (f"Traceback (most recent call last):\n  File \"{random_path(rng)}\", line {rng.randint(1, 900)}, in "
                 f"{random_ident(rng)}\n    {random_ident(rng)}({random_ident(rng, 1)})\n{random_camel(rng)}Error: {' '.join(random_words(rng, 3, 8))}\n")
    return line


def _piece_json(rng: random.Random, i: int) -> str:
    rec = {
        "id": f"{rng.choice(NAMES)}-{i:05d}",
        "name": " ".join(random_words(rng, 2, 4)),
        "status": rng.choice(("active", "pending", "failed", "done")),
        "count": rng.randint(0, 5000),
        "score": round(rng.random() * 100, 2),
        "tags": [rng.choice(WORDS) for _ in range(rng.randint(1, 4))],
        "owner": {"user": random_ident(rng, 2), "team": rng.choice(NAMES)},
        "description": random_sentence(rng, 6, 14),
    }
    return json.dumps(rec, indent=2) + ",\n"


def _piece_search(rng: random.Random, i: int) -> str:
    return (f"{i + 1}. {' '.join(random_words(rng, 3, 8)).title()}\n   URL: {random_url(rng)}\n"
            f"   {random_sentence(rng)} {random_sentence(rng)}\n\n")


def _piece_listing(rng: random.Random, i: int) -> str:
    if rng.random() < 0.5:
        return f"{random_path(rng)}:{rng.randint(1, 2000)}:    {random_ident(rng)} = {random_ident(rng)}({random_ident(rng, 1)})\n"
    return (f"{'d' if rng.random() < 0.2 else '-'}rw-r--r--  {rng.randint(0, 999999):>8d}  "
            f"2025-0{1 + i % 9}-{1 + i % 28:02d}  {random_path(rng)}\n")


PIECES = {
    "prose": _piece_prose,
    "code": _piece_code,
    "log": _piece_log,
    "json": _piece_json,
    "search": _piece_search,
    "listing": _piece_listing,
}
DEFAULT_CHARS_PER_TOKEN = {"prose": 4.5, "code": 3.0, "log": 3.0, "json": 3.0, "search": 4.0, "listing": 3.0}


class TextFactory:
    """Deterministic texts of a given size in tokens, calibrated on a server's tokenizer."""

    def __init__(self) -> None:
        self.chars_per_token: dict[str, float] = dict(DEFAULT_CHARS_PER_TOKEN)
        self.calibrated_on: str | None = None
        self._memo: dict[tuple, str] = {}
        self._frozen = False  # set once a text was handed out: every server must get the same texts

    def calibrate(self, server_name: str, url: str) -> None:
        """Chars per token of each kind, from the server's /tokenize (kept for the whole run)."""
        if self._frozen:
            return
        self._frozen = True
        measured = {}
        for kind in PIECES:
            sample = self.raw(kind, f"calibration-{kind}", 12000)
            tokens = tokenize_text(url, sample)
            if tokens:
                measured[kind] = len(sample) / len(tokens)
        if len(measured) == len(PIECES):
            self.chars_per_token = measured
            self.calibrated_on = server_name
            self._memo.clear()

    @staticmethod
    def raw(kind: str, seed: str, n_chars: int) -> str:
        rng = random.Random(f"{kind}:{seed}")
        out, n, i = [], 0, 0
        piece = PIECES[kind]
        while n < n_chars:
            s = piece(rng, i)
            out.append(s)
            n += len(s)
            i += 1
        return "".join(out)

    def text(self, kind: str, seed: str, n_tokens: int) -> str:
        self._frozen = True
        key = (kind, seed, n_tokens)
        if key not in self._memo:
            n_chars = max(1, int(n_tokens * self.chars_per_token[kind]))
            t = self.raw(kind, seed, n_chars)
            self._memo[key] = t.rstrip(",\n ") + "\n" if kind == "json" else t.rstrip() + "\n"
        return self._memo[key]
