"""llama-server's flags that warmslot does not implement itself.

Every flag of llama-server (at the llama.cpp commit warmslot embeds) either is one of
warmslot's own (`flags.py`), or is listed here: accepted and logged as having no effect, with
the reason, or refused with a message that names the flag and the reason. None falls through
to argparse's "unrecognized" or "ambiguous option" errors.

Each line of `CATALOG`: the flag's names, its arity (`-`: no value, `1`: one value, `?`: an
optional value), `ignore` or `refuse`, and the reason.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

CATALOG = """
--usage | - | ignore | --help prints the usage
-cl --cache-list | - | refuse | models are files given with -m or downloaded with -hf; there is no model list
--completion-bash | - | refuse | no shell completion script is generated
-C --cpu-mask | 1 | ignore | llama.cpp's threads are placed by the operating system
-Cr --cpu-range | 1 | ignore | llama.cpp's threads are placed by the operating system
--cpu-strict | 1 | ignore | llama.cpp's threads are placed by the operating system
--prio | 1 | ignore | threads run at the process's priority (use nice)
--poll | 1 | ignore | llama.cpp's default polling is kept
-Cb --cpu-mask-batch | 1 | ignore | llama.cpp's threads are placed by the operating system
-Crb --cpu-range-batch | 1 | ignore | llama.cpp's threads are placed by the operating system
--cpu-strict-batch | 1 | ignore | llama.cpp's threads are placed by the operating system
--prio-batch | 1 | ignore | threads run at the process's priority (use nice)
--poll-batch | 1 | ignore | llama.cpp's default polling is kept
--predict | 1 | alias | -n
--keep | 1 | ignore | the context is never shifted: a request that does not fit gets a clear error
--perf --no-perf | - | ignore | timings are always measured (/metrics, `timings` in replies)
-e --escape --no-escape | - | ignore | escapes apply only to command-line prompts, which a server has none of
--rope-scaling | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
--rope-scale | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
--rope-freq-base | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
--rope-freq-scale | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
--yarn-orig-ctx | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
--yarn-ext-factor | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
--yarn-attn-factor | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
--yarn-beta-slow | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
--yarn-beta-fast | 1 | refuse | RoPE and YaRN come from the model's metadata; overriding them is not offered
-kvo --kv-offload | - | ignore | the KV cache is offloaded with the layers (the default)
-nkvo --no-kv-offload | - | refuse | the KV cache stays with its layers; keeping it in RAM is not offered
--no-host | - | ignore | host buffers are chosen by llama.cpp
-dt --defrag-thold | 1 | ignore | deprecated in llama.cpp: the KV cache needs no defragmentation
-lm --load-mode | 1 | ignore | weights are memory-mapped (--no-mmap reads them)
-lzm --lazy-mode | 1 | ignore | weights are memory-mapped (--no-mmap reads them)
--numa | 1 | refuse | NUMA placement is not offered
-ncffn --n-cpu-ffn | 1 | refuse | dense FFN placement is not offered: use -ot with a pattern for those tensors
--gpu-layers | 1 | alias | -ngl
-fit | 1 | alias | --fit
--check-tensors | - | ignore | tensors are checked by llama.cpp when the model loads
--override-kv | 1 | refuse | model metadata is used as written in the GGUF
--op-offload --no-op-offload | - | ignore | llama.cpp's default operation offload is kept
--control-vector | 1 | refuse | control vectors are not supported
--control-vector-scaled | 1 | refuse | control vectors are not supported
--control-vector-layer-range | 2 | refuse | control vectors are not supported
-mu --model-url | 1 | refuse | download models with -hf USER/REPO, or give a file with -m
-dr --docker-repo | 1 | refuse | download models with -hf USER/REPO, or give a file with -m
--log-disable | - | alias | --log-level error
--log-file | 1 | refuse | the log goes to standard error; redirect it
--log-jsonl --no-log-jsonl | - | ignore | the log is plain text lines
--log-colors | ? | ignore | the log is plain text lines
--log-verbose | - | alias | -v
--offline | - | ignore | warmslot reaches the network only for -hf, and uses a cached download when one exists
-lv --verbosity --log-verbosity | 1 | ignore | the log level is --log-level
--log-prefix --no-log-prefix | - | ignore | the log format is fixed
--log-timestamps --no-log-timestamps | - | ignore | log lines always carry timestamps
--spec-draft-type-k | 1 | alias | -ctkd
--spec-draft-type-v | 1 | alias | -ctvd
--samplers | 1 | ignore | the sampler order is llama-server's default (penalties, top-k, top-p, min-p, temperature)
--sampler-seq --sampling-seq | 1 | ignore | the sampler order is llama-server's default (penalties, top-k, top-p, min-p, temperature)
--ignore-eos | - | refuse | a default for every request is not offered: send "ignore_eos": true per request
--top-nsigma --top-n-sigma | 1 | refuse | a default is not offered: send the sampling field per request
--xtc-probability | 1 | refuse | a default is not offered: send the sampling field per request
--xtc-threshold | 1 | refuse | a default is not offered: send the sampling field per request
--typical --typical-p | 1 | refuse | a default is not offered: send the sampling field per request
--dry-multiplier | 1 | refuse | a default is not offered: send the sampling field per request
--dry-base | 1 | refuse | a default is not offered: send the sampling field per request
--dry-allowed-length | 1 | refuse | a default is not offered: send the sampling field per request
--dry-penalty-last-n | 1 | refuse | a default is not offered: send the sampling field per request
--dry-sequence-breaker | 1 | refuse | a default is not offered: send the sampling field per request
--adaptive-target | 1 | refuse | adaptive-p sampling is not supported
--adaptive-decay | 1 | refuse | adaptive-p sampling is not supported
--dynatemp-range | 1 | refuse | a default is not offered: send the sampling field per request
--dynatemp-exp | 1 | refuse | a default is not offered: send the sampling field per request
--mirostat | 1 | refuse | a default is not offered: send the sampling field per request
--mirostat-lr | 1 | refuse | a default is not offered: send the sampling field per request
--mirostat-ent | 1 | refuse | a default is not offered: send the sampling field per request
-l --logit-bias | 1 | refuse | a default is not offered: send "logit_bias" per request
--grammar | 1 | refuse | a default grammar is not offered: send "grammar" per request
--grammar-file | 1 | refuse | a default grammar is not offered: send "grammar" per request
-j --json-schema | 1 | refuse | a default schema is not offered: send "response_format" or "json_schema" per request
-jf --json-schema-file | 1 | refuse | a default schema is not offered: send "response_format" or "json_schema" per request
-bs --backend-sampling --backend_sampling | - | ignore | sampling runs on the CPU after each decode
--spec-draft-hf -hfd -hfrd --hf-repo-draft | 1 | refuse | give the draft model as a file with -md
--spec-draft-threads -td --threads-draft | 1 | ignore | the draft model uses --threads
--spec-draft-threads-batch -tbd --threads-batch-draft | 1 | ignore | the draft model uses --threads-batch
--spec-draft-cpu-mask -Cd --cpu-mask-draft | 1 | ignore | llama.cpp's threads are placed by the operating system
--spec-draft-cpu-range -Crd --cpu-range-draft | 1 | ignore | llama.cpp's threads are placed by the operating system
--spec-draft-cpu-strict --cpu-strict-draft | 1 | ignore | llama.cpp's threads are placed by the operating system
--spec-draft-prio --prio-draft | 1 | ignore | threads run at the process's priority (use nice)
--spec-draft-poll --poll-draft | 1 | ignore | llama.cpp's default polling is kept
--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft | 1 | ignore | llama.cpp's threads are placed by the operating system
--spec-draft-cpu-strict-batch --cpu-strict-batch-draft | 1 | ignore | llama.cpp's threads are placed by the operating system
--spec-draft-prio-batch --prio-batch-draft | 1 | ignore | threads run at the process's priority (use nice)
--spec-draft-poll-batch --poll-batch-draft | 1 | ignore | llama.cpp's default polling is kept
--spec-draft-override-tensor -otd --override-tensor-draft | 1 | refuse | the draft model's placement follows -ngld
--spec-draft-cpu-moe -cmoed --cpu-moe-draft | - | refuse | the draft model's placement follows -ngld
--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft | 1 | refuse | the draft model's placement follows -ngld
--spec-draft-n-max | 1 | alias | --draft-max
--spec-draft-n-min | 1 | alias | --draft-min
--spec-synth-len | 1 | refuse | synthetic acceptance is a llama.cpp test device, not offered
--spec-synth-rates | 1 | refuse | synthetic acceptance is a llama.cpp test device, not offered
--spec-draft-p-split --draft-p-split | 1 | ignore | drafts are one sequence (no tree split)
--spec-draft-p-min | 1 | alias | --draft-p-min
--spec-draft-backend-sampling --no-spec-draft-backend-sampling | - | ignore | the draft samples on the CPU
--spec-draft-device | 1 | alias | -devd
--spec-draft-ngl | 1 | alias | -ngld
--spec-draft-model | 1 | alias | -md
--spec-ngram-mod-n-min | 1 | refuse | --spec-type ngram-mod is not supported (ngram-simple and draft are)
--spec-ngram-mod-n-max | 1 | refuse | --spec-type ngram-mod is not supported (ngram-simple and draft are)
--spec-ngram-mod-n-match | 1 | refuse | --spec-type ngram-mod is not supported (ngram-simple and draft are)
--spec-ngram-simple-size-n | 1 | alias | --spec-ngram-size-n
--spec-ngram-simple-size-m | 1 | alias | --spec-ngram-size-m
--spec-ngram-simple-min-hits | 1 | ignore | ngram-simple drafts from the first earlier occurrence (one hit)
--spec-ngram-map-k-size-n | 1 | refuse | --spec-type ngram-map-k is not supported (ngram-simple and draft are)
--spec-ngram-map-k-size-m | 1 | refuse | --spec-type ngram-map-k is not supported (ngram-simple and draft are)
--spec-ngram-map-k-min-hits | 1 | refuse | --spec-type ngram-map-k is not supported (ngram-simple and draft are)
--spec-ngram-map-k4v-size-n | 1 | refuse | --spec-type ngram-map-k4v is not supported (ngram-simple and draft are)
--spec-ngram-map-k4v-size-m | 1 | refuse | --spec-type ngram-map-k4v is not supported (ngram-simple and draft are)
--spec-ngram-map-k4v-min-hits | 1 | refuse | --spec-type ngram-map-k4v is not supported (ngram-simple and draft are)
--spec-ngram-min-hits | 1 | refuse | removed in llama.cpp: use --spec-ngram-simple-min-hits
-lcs --lookup-cache-static | 1 | refuse | lookup caches are not supported (--spec-type ngram-simple drafts from the context)
-lcd --lookup-cache-dynamic | 1 | refuse | lookup caches are not supported (--spec-type ngram-simple drafts from the context)
--kv-unified-per-slot | 1 | refuse | a per-slot limit in the unified pool is not offered: use --no-kv-unified for fixed streams
--swa-checkpoints | 1 | alias | -ctxcp
-cms --checkpoint-min-step | 1 | alias | --checkpoint-every
--cache-idle-slots | - | ignore | idle slots are always saved to the prompt cache (and parked) before their cells are reused
--no-cache-idle-slots | - | ignore | idle slots are always saved to the prompt cache; --no-park-idle keeps them in the KV pool
--context-shift | - | refuse | the context is never shifted: a request that does not fit gets a clear error
--no-context-shift | - | ignore | the context is never shifted (the default)
-r --reverse-prompt | 1 | refuse | a default stop string is not offered: send "stop" per request
-sp --special | - | ignore | special tokens are printed where the reply format needs them
--warmup --no-warmup | - | ignore | the model is warmed up by its first decode
-nocb --no-cont-batching | - | refuse | batching is always continuous
-mmu --mmproj-url | 1 | refuse | give the projector as a file with --mmproj
--mmproj-auto | - | ignore | -hf downloads the repository's projector unless --no-mmproj
--mmproj-offload | - | ignore | the projector is offloaded unless --no-mmproj-offload
-mmdev --mmproj-device | 1 | refuse | the projector goes to the first GPU, or stays on the CPU with --no-mmproj-offload
--mtmd-batch-max-tokens | 1 | ignore | images are encoded one at a time, in one batch
--video-fps | 1 | refuse | video input is not supported
--video-timestamp-interval | 1 | refuse | video input is not supported
--video-ffmpeg-dir | 1 | refuse | video input is not supported
--embd-normalize | 1 | ignore | embeddings are L2-normalized, as OpenAI's are
--reuse-port | - | refuse | one server owns its port
--path | 1 | refuse | the server serves its own web page only (--no-webui turns it off)
--api-prefix | 1 | refuse | routes are served at the root (/v1/... and llama-server's paths)
--ui-config --webui-config | 1 | ignore | the web page has no settings to preset
--ui-config-file --webui-config-file | 1 | ignore | the web page has no settings to preset
--ui-mcp-proxy --webui-mcp-proxy | - | refuse | the web page has no MCP proxy
--no-ui-mcp-proxy --no-webui-mcp-proxy | - | ignore | the web page has no MCP proxy
--tools | 1 | refuse | built-in tools that the server runs are not offered: agents run their own tools
--tools-runtime | 1 | refuse | built-in tools that the server runs are not offered: agents run their own tools
--mcp-servers-config | 1 | refuse | the server does not call MCP servers: agents call their own
--mcp-servers-json | 1 | refuse | the server does not call MCP servers: agents call their own
-ag --agent | - | refuse | built-in tools that the server runs are not offered: agents run their own tools
-no-ag --no-agent | - | ignore | built-in tools are never on
--ui --webui | - | ignore | the web page is on unless --no-webui
--no-ui | - | alias | --no-webui
--embedding | - | alias | --embeddings
--ssl-key-file | 1 | refuse | TLS is not served: put a reverse proxy in front
--ssl-cert-file | 1 | refuse | TLS is not served: put a reverse proxy in front
-to --timeout | 1 | ignore | idle connections are kept by uvicorn's defaults; --request-timeout bounds a request
--sse-ping-interval | 1 | ignore | streams are not pinged
--threads-http | 1 | ignore | HTTP requests run on one event loop; the engine has its own thread
--cache-prompt | - | ignore | prompts are always cached
--no-cache-prompt | - | ignore | prompts are always cached (a request may send "cache_prompt": false)
--props | - | ignore | POST /props is not served: settings are fixed at start
--models-autoload --no-models-autoload | - | ignore | a model loads when a request names it (POST /models/load loads one ahead)
--no-jinja | - | ignore | chat templates always run with Jinja; built-in template names give llama.cpp's templates
--reasoning-effort | 1 | ignore | send "reasoning_effort" or "chat_template_kwargs" per request
--reasoning-budget-message | 1 | refuse | the reasoning budget ends the thought with the template's closing tag only
--reasoning-preserve --no-reasoning-preserve | - | ignore | earlier turns' reasoning is rendered as the chat template decides
--skip-chat-parsing --no-skip-chat-parsing | - | ignore | replies are parsed for reasoning and tool calls as --reasoning-format and --tool-format say
--prefill-assistant --no-prefill-assistant | - | ignore | a final assistant message is continued (prefilled)
-sps --slot-prompt-similarity | 1 | ignore | slots are chosen by the longest token prefix
--log-prompts-dir | 1 | refuse | prompts are not logged to files
--embd-gemma-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--fim-qwen-1.5b-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--fim-qwen-3b-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--fim-qwen-7b-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--fim-qwen-7b-spec | - | refuse | model presets that download are not offered: use -hf USER/REPO
--fim-qwen-14b-spec | - | refuse | model presets that download are not offered: use -hf USER/REPO
--fim-qwen-30b-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--gpt-oss-20b-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--gpt-oss-120b-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--vision-gemma-4b-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--vision-gemma-12b-default | - | refuse | model presets that download are not offered: use -hf USER/REPO
--spec-default | - | refuse | a preset is not offered: set --spec-type and its options
"""


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    arity: str  # "-", "1", "2" or "?"
    action: str  # ignore, refuse, alias
    reason: str  # for alias: the warmslot flag it means

    @property
    def dest(self) -> str:
        return "llama_" + max(self.names, key=len).lstrip("-").replace("-", "_")


def catalog() -> list[Flag]:
    out = []
    for line in CATALOG.strip().splitlines():
        names, arity, action, reason = (part.strip() for part in line.split("|"))
        out.append(Flag(tuple(names.split()), arity, action, reason))
    return out


FLAGS = catalog()


def add_to(parser: argparse.ArgumentParser) -> None:
    """Register the catalog's flags on the parser: aliases add names to warmslot's own flag,
    the others store under a private name that `effects` reads."""
    known = parser._option_string_actions  # noqa: SLF001 (argparse has no public lookup)
    group = parser.add_argument_group("llama-server flags with no effect here or refused (see docs/llama-server-flags.md)")
    for flag in FLAGS:
        if flag.action == "alias":
            target_flag, *value = flag.reason.split()
            target = known[target_flag]
            if value:  # a flag that means the target with a fixed value
                group.add_argument(*flag.names, dest=target.dest, action="store_const", const=value[0], help=argparse.SUPPRESS)
                continue
            for name in flag.names:
                known[name] = target
                target.option_strings.append(name)
            continue
        kwargs: dict = {"dest": flag.dest, "default": None, "help": argparse.SUPPRESS}
        if flag.arity == "-":
            kwargs.update(action="store_const", const=True)
        elif flag.arity == "?":
            kwargs.update(nargs="?", const=True)
        elif flag.arity == "2":
            kwargs.update(nargs=2)
        group.add_argument(*flag.names, **kwargs)


def effects(a: argparse.Namespace) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(ignored, refused) flags that were given, each with its reason."""
    ignored, refused = [], []
    for flag in FLAGS:
        if flag.action == "alias" or getattr(a, flag.dest, None) is None:
            continue
        (refused if flag.action == "refuse" else ignored).append((flag.names[-1], flag.reason))
    return ignored, refused


def markdown() -> str:
    """docs/llama-server-flags.md: the catalog as a table (tests/project/test_docs.py keeps them equal)."""
    lines = [
        "# llama-server's flags in warmslot",
        "",
        "Every flag of llama-server at the llama.cpp commit warmslot embeds either works as it does there",
        "(see `warmslot --help`), or is listed here: **ignored** flags are accepted and logged at start-up",
        "as having no effect, with the reason; **refused** flags stop the start with a message that names",
        "the flag and the reason; **alias** flags are another name for a warmslot flag.",
        "",
        "| flag | what warmslot does | why |",
        "|---|---|---|",
    ]
    for flag in FLAGS:
        names = ", ".join(f"`{n}`" for n in flag.names)
        if flag.action == "alias":
            lines.append(f"| {names} | alias | the same as `{flag.reason}` |")
        else:
            lines.append(f"| {names} | {'ignored' if flag.action == 'ignore' else 'refused'} | {flag.reason} |")
    return "\n".join(lines) + "\n"
