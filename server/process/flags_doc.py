"""docs/flags.md, the flag reference: the flag table (flags.py) with the words that explain each flag.

The names and the defaults come from the table's rows; ROWS below gives each flag's meaning, in the
order the reference lists them, several flags to a row where they go together. `flags_markdown()`
makes the page; `python -m warmslot.server.process.flags_doc` (from the repository root) writes it,
and tests/project/test_flags_doc.py fails when docs/flags.md is not what it makes. Every flag of FLAGS is in
exactly one row (`flags_markdown()` checks it), so a new flag needs its words here.

A row's key names its flags by their last long name: ` / ` between flags with a default each,
`, ` between flags that share one default and one meaning.
"""

from __future__ import annotations

import pathlib
import sys

from .flag_values import parse_size
from .flags import FLAGS, NOOP, OFF, ON, SIZE, Flag

PAGE = "docs/flags.md"
COMMAND = "python -m warmslot.server.process.flags_doc"

# argparse's own flags, which are not rows of FLAGS (flag_parser.py adds them)
OWN_FLAGS = ("--version",)

ROWS: list[tuple[str, str]] = [
    ('--model',
     'GGUF model path'),
    ('--host',
     'address to listen on'),
    ('--port',
     'port'),
    ('--parallel',
     'slots (sequences decoded together, continuous batching)'),
    ('--ctx-size',
     'KV cache tokens of all slots together, as in llama-server (a slot gets `--ctx-size / --parallel`, up'
     " to all of them in one pool); 0: the model's training context when its KV cache fits the free device"
     ' memory (available RAM on a CPU, less the prompt cache budget), else the largest context that fits; '
     'the choice is logged'),
    ('--n-gpu-layers',
     'layers on the GPU (-1: all); unset, `--fit` may offload fewer when the model does not fit'),
    ('--split-mode',
     'how to spread the model over several GPUs: `none` (one GPU, `--main-gpu`), `layer` (whole layers and'
     ' their KV cache per GPU), `row` (weight rows across GPUs; KV cache and results on `--main-gpu`), '
     '`tensor` (experimental in llama.cpp)'),
    ('--tensor-split',
     'proportion of the model for each GPU, e.g. `3,1`'),
    ('--main-gpu',
     'the GPU for the whole model with `-sm none`, or for the KV cache and results with `row`'),
    ('--device',
     'devices to offload to, as `--list-devices` names them (`CUDA0,CUDA1`, `RPC0`); `none`: no offload'),
    ('--list-devices',
     'print the devices the model can be offloaded to, with their memory, and exit'),
    ('--rpc',
     'RPC servers (`host:port,...`) whose devices join the ones the model is spread over; needs '
     'llama-cpp-python built with `-DGGML_RPC=on` (see [Scaling out](scaling-out.md))'),
    ('--cpu-moe',
     'keep the experts of every layer of a mixture-of-experts model in RAM (tensors matching '
     '`\\.ffn_(up\\|down\\|gate)_exps`); see [MoE models](models.md#moe-models-expert-offload-and---fit)'),
    ('--n-cpu-moe',
     'keep the experts of the first N layers in RAM'),
    ('--override-tensor',
     '`PATTERN=BUFFER,...`: tensors whose name the regular expression finds go to that buffer type (`CPU`,'
     ' `CUDA0`, ...; the first match wins; repeatable). A bad pattern or an unknown buffer type stops the '
     'start-up with a message naming the flag'),
    ('--fit',
     'on a GPU, choose what was left unset (the context, then expert offload, then GPU layers) so the '
     'weights, the KV cache of `-np` slots and the compute buffers fit the free device memory less '
     '`--fit-target`; a value you set is never changed, and when it cannot fit the server refuses to start'
     ' with the numbers. No effect on a CPU'),
    ('--fit-target',
     'MiB left free on each device by `--fit` (one value for every device, where llama-server also takes a'
     ' list); also the margin of the capacity answer (`can hold`)'),
    ('--fit-ctx',
     'the smallest context `--fit` may choose'),
    ('--fit-print',
     'load the model, print the capacity table with what the server can hold (largest context per slot for'
     " this `-np`, most slots at this context, the prompt cache's RAM, with the margin) and exit without "
     'serving'),
    ('--flash-attn',
     "flash attention: on, off, auto. `auto` is llama.cpp's choice on a GPU, and off on the CPU (with an "
     'f16/f32/bf16 V cache, while the attention scores of a batch, `--ubatch-size` x context x heads floats, '
     "take at most an eighth of the RAM): llama.cpp's CPU flash attention decodes up to 3x slower at depth, "
     'and its sums move a cache hit several times further from a cold run ([CPU flash attention](../README.md#cpu-flash-attention))'),
    ('--cache-type-k / --cache-type-v',
     'KV cache types (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)'),
    ('--batch-size / --ubatch-size',
     'tokens per decode step / physical batch'),
    ('--threads / --threads-batch',
     'CPU threads (0: physical cores)'),
    ('--n-predict',
     "default `max_tokens` (-1: until the slot's context is full)"),
    ('--chat-template',
     "a Jinja file, or a built-in by name: warmslot's Jinja `gemma`, `chatml`, `llama3`, `mistral`, or any"
     " of llama.cpp's own formats (`command-r`, `llama2`, `phi3`, `zephyr`, ... as "
     '`llama_chat_builtin_templates` lists them), which llama.cpp renders as llama-server does; tools are '
     'then injected as a system prompt'),
    ('--chat-template-file',
     'a Jinja chat template file'),
    ('--chat-template-kwargs',
     'a JSON object of chat template variables for every request (`\'{"enable_thinking": false}\'`); a '
     "request's `chat_template_kwargs` override them"),
    ('--alias',
     'model name reported by the API; several names comma-separated, the first is reported and all are '
     'accepted by `GET /v1/models/{id}`'),
    ('--hf-repo',
     'download the model from Hugging Face, `USER/REPO[:QUANT]`, as llama-server does: the GGUF whose name'
     ' carries the quant (case-insensitive, default `Q4_K_M`, else the first GGUF; never an `mmproj` '
     "file), all parts of a split model, into huggingface_hub's cache with a progress bar; `HF_TOKEN`, "
     '`HF_ENDPOINT` and `HF_HOME` apply, and a cached model is used when the Hub cannot be reached (at '
     'once when its host does not answer a connection and no proxy is set; through a proxy, after the '
     "library's retries). The repository's projector comes with it, as llama-server's `-hf` fetches it: a "
     "GGUF named `*mmproj*` in the model's folder or one above it, of the precision nearest the model's "
     '(`--no-mmproj` leaves it, `--mmproj` overrides it)'),
    ('--hf-file',
     'the file of `--hf-repo` to download (overrides the quant)'),
    ('--hf-token',
     'Hugging Face token'),
    ('--no-mmap / --mlock',
     'read the weights into memory instead of mapping the file / lock them in RAM'),
    ('--repack / --no-repack',
     "CPU weight repacking (llama.cpp's AMX and interleaved-quant buffer types): its kernels sum a batch "
     'of tokens in another order than one token, so a conversation back from the prompt cache may answer '
     'otherwise than cold; off unless `--repack` (on 2 cores of an AMD EPYC it was slower too: Gemma 3 '
     '270M 603 against 636 prompt and 74 against 79 generated tokens/s in llama-bench); where the CPU '
     'offers AMX inside a virtual machine, tile instructions can fault'),
    ('--api-key',
     'require `Authorization: Bearer KEY` (several keys: comma-separated)'),
    ('--max-queue',
     'requests that may wait for a slot; more get 503 with `Retry-After`'),
    ('--max-n',
     'most choices one request may ask for (`n`); more get 400'),
    ('--max-messages',
     'most messages in one chat request, and most messages a Responses request makes (its stored history '
     'plus its `input` items); more get 400 naming `messages` or `input` (0: no limit)'),
    ('--max-tools',
     'most tools in one request; more get 400 naming `tools` (0: no limit)'),
    ('--admin-key',
     'the key that sees every tenant on `/slots` and `/engine` and reads `/metrics` (also valid on every '
     'route); see [Security](security.md)'),
    ('--metrics-open',
     'serve `/metrics` without a key even when `--api-key` is set (see [Security](security.md) for the risk)'),
    ('--max-body',
     'largest request body; larger ones get 413 (0: no limit)'),
    ('--request-timeout',
     'seconds a request may take, waiting and running; it then ends with 408 `request_timeout` (0: no '
     "limit). A request's `timeout` field can only shorten it"),
    ('--shutdown-timeout',
     'seconds running requests get to finish after SIGTERM before they end with an error'),
    ('--sleep-idle-seconds',
     'unload the model after this many seconds without a request; the prompt cache and the disk tier stay '
     "(the idle slots' contents move to RAM first), and the next request that needs the model loads it "
     "again: see [Sleeping](models.md#sleeping); with several models, each model's default keep-alive"),
    ('--models-dir',
     'serve every model of this folder by name, each loaded when a request names it: a GGUF at the top is '
     'a model named by its file (without `.gguf`), a subfolder a model named by the folder (its projector '
     'the `mmproj*.gguf` beside it, a split model its `-00001-of-` part), as llama-server lays it out; see'
     ' [Several models](models.md#several-models)'),
    ('--models-preset',
     'an INI file of models, each with its name, path, other names (wildcards allowed) and its own flags; '
     'see [Several models](models.md#several-models)'),
    ('--models-max',
     'models loaded at once; to load another, the least recently used idle one is unloaded, its '
     'conversations kept in its prompt cache'),
    ('--models-default',
     'the model that answers a `model` no name matches (default: such a request gets 404 '
     '`model_not_found`)'),
    ('--models-load-timeout',
     'seconds a request waits for its model to load, or for room to load it, before a 503 with '
     '`Retry-After`'),
    ('--swa-full',
     'full KV cache on sliding-window models (more memory, no checkpoints needed)'),
    ('--ctx-checkpoints',
     'checkpoints kept per slot'),
    ('--quick-tokens',
     'with a stream per sequence, a request that continues a conversation an idle sequence on the device '
     'holds (a spare stream, or a slot), computing at most this many new tokens, starts at once beside the'
     ' `--parallel` running ones, up to twice `--parallel` in all, and its prefill goes first; it takes no'
     ' memory and no copy through RAM. 0: it waits for a slot like any other'),
    ('--checkpoint-every',
     'tokens between checkpoints inside a long prefill (0: none)'),
    ('--checkpoint-ram',
     'memory for checkpoints per slot (a size, see below)'),
    ('--cache-reuse',
     'the least tokens of a chunk of a slot\'s previous prompt that is shifted to where the new prompt has '
     'it, after text before it was removed (an edit above the cursor, the oldest chunk of an editor\'s '
     'extra context dropped), instead of computing it again. Approximate (the shifted KV was computed after '
     'other text), so off by default; attention models only; responses say how many tokens it gave. See '
     '[Shifting chunks](reuse.md#shifting-chunks---cache-reuse)'),
    ('--cache-ram',
     'RAM prompt cache budget: `8192` is 8192 MiB as in llama-server, or `8GiB` (0: off; auto: a quarter '
     'of the RAM, at most 32 GiB)'),
    ('--cache-vram',
     'device memory for spare sequences, e.g. `8192` (MiB), `8GiB`, `auto` or `0` (none): idle '
     'conversations stay on the GPU and come back with no copy. With a stream per slot (attention models) '
     'each spare is a stream (`auto`: as many as free device memory holds after a margin of 10% and 1 GiB,'
     ' at most 16 per slot and 64 in all; on the CPU, where the KV cache is in RAM, as many as a quarter '
     'of `--cache-ram` holds, at most 3 per slot, and the prompt cache keeps the rest); sliding-window and'
     " hybrid models get streams too (a hybrid's spare is a stream plus one recurrent state); recurrent "
     'and hybrid models in one pool get two spare sequences per slot in it (with a SIZE, as many as it '
     'holds recurrent states, at most 16 per slot and 64 in all). Attention models in one pool '
     '(`--kv-unified on`, or one slot) get spares only with a SIZE: idle conversations then keep up to SIZE '
     'of cells in the pool beyond the running ones\', and conversations that share a prefix share its '
     'cells, but every step\'s attention spans them (on the CPU, decode next to 20K cells of others is 1.7x '
     'slower with `-fa on` and 6.6x with flash attention off, the CPU default: see [State held once](state-segments.md#one-pool-or-a-stream-per-slot-what-each-costs)). A '
     'conversation that comes back to a stream apart from the busy ones is copied on the device next to '
     'them, so the busy streams stay one run. See [Benchmarks](benchmarks/README.md#at-a-glance) for what it '
     'wins and costs'),
    ('--cache-disk',
     'directory of the [disk tier](reuse.md#disk-tier): entries the RAM cache evicts, and those worth keeping at '
     'shutdown, are written there and survive restarts (created owner-only; needs `--cache-ram` above 0)'),
    ('--cache-disk-size',
     'byte budget of `--cache-disk`, a size as for `--cache-ram`, e.g. `200GiB` (auto: half the space free'
     ' at start, at most 64 GiB)'),
    ('--slot-save-path',
     "an existing directory for `POST /slots/{id}?action=save\\|restore\\|erase` (llama-server's slot "
     'persistence)'),
    ('--slot-save-size',
     'most bytes the files in `--slot-save-path` may take; a save past it gets 507 `insufficient_storage`'),
    ('--prefill-chunk',
     'prompt tokens per step while other slots generate (0: `--ubatch-size`)'),
    ('--kv-unified / --no-kv-unified',
     'one KV pool shared by all slots (a slot may use all of it), or a stream of `--ctx-size / --parallel`'
     " cells per slot (attention then spans only a slot's own cells, and its state is one contiguous "
     'copy); auto: a stream per slot with several slots on attention, sliding-window and hybrid models, '
     'one pool otherwise (one slot, recurrent models)'),
    ('--no-cache-segments',
     'store every prompt-cache and disk-tier entry whole. By default, on attention, sliding-window and '
     "hybrid models, an entry that shares at least 64 tokens with one the cache holds (another session's "
     "system prompt and tools, or the previous turn) stores only its own tokens' state, chained to it, so "
     'RAM holds a shared prefix once; loading joins the chain in host memory (see [Prompt cache '
     'segments](reuse.md#prompt-cache-segments))'),
    ('--no-park-idle',
     "keep idle slots' contents in the KV pool when another request starts (by default they move to the "
     'prompt cache, because attention runs over every cell in use)'),
    ('--no-slots',
     'disable `/slots` and `/engine`'),
    ('--embeddings',
     'serve `/v1/embeddings` from a second llama context on the same weights (generation is unaffected)'),
    ('--pooling',
     "embedding pooling: `auto` (the model's own; mean when it declares none), `mean`, `cls`, `last`, "
     '`none` (a vector per token, on `/embeddings` only)'),
    ('--reranking',
     "serve `/rerank` from a context with llama.cpp's rank pooling: relevance scores from a reranker model"),
    ('--responses-store',
     'responses kept per tenant for `previous_response_id` and `GET /v1/responses/{id}`; older ones are '
     'evicted'),
    ('--responses-secret',
     "the secret that signs the turn in a `/v1/responses` reasoning item's `encrypted_content` (see "
     '[OpenAI Codex](agents.md#openai-codex)); give every replica, and every restart, the same one (or '
     "`WARMSLOT_RESPONSES_SECRET`) so that clients' histories stay reusable; by default a random one per "
     'process, and after a restart old blobs are ignored'),
    ('--mmproj',
     'a vision or audio projector GGUF for the model: chat messages may then hold images or audio (see '
     '[Images and audio](images-and-audio.md))'),
    ('--no-mmproj-offload',
     'keep the projector on the CPU'),
    ('--image-min-tokens / --image-max-tokens',
     "the fewest / most tokens an image takes, for projectors of dynamic resolution (-1: the projector's "
     'own)'),
    ('--image-max-bytes / --image-max-pixels',
     'the largest image (or audio clip) accepted, in decoded bytes, and the most pixels of an image; more '
     'get 400'),
    ('--media-path',
     'a folder that `image_url` `file://` URLs are read from, as llama-server does: paths inside it only '
     '(no `..`, no link out of it); without it such URLs get 400'),
    ('--image-fetch / --image-fetch-timeout',
     'fetch `http(s)` image URLs, each within `--image-max-bytes` and the timeout (seconds, in all); '
     'without it such URLs get 400. llama-server fetches them always; here the server reaches out only '
     'when asked to'),
    ('--no-mmproj-auto',
     "`-hf`: do not download the repository's projector"),
    ('--spm-infill',
     '`/infill` lays the prompt out suffix-prefix-middle, for models trained that way (default: '
     'prefix-suffix-middle; see [the API](api.md#infill))'),
    ('--keep-billing-header',
     "`/v1/messages`: keep Claude Code's `x-anthropic-billing-header` system block in the prompt (it "
     'changes on every request, so every request then recomputes the whole prompt; see [Claude '
     'Code](agents.md#claude-code))'),
    ('--tool-format',
     'hermes, hermes_xml, llama3, mistral or json'),
    ('--reasoning-format',
     'where a leading `<think>...</think>` block goes: `auto` to `reasoning_content` when the chat '
     'template uses think blocks, `deepseek` always, `none` leaves it in `content`'),
    ('--reasoning-budget',
     'tokens a reply may think before `</think>` is forced (-1: no limit, 0: end thinking at once); a '
     "request may send `reasoning_budget_tokens` (or `thinking_budget_tokens`), -1 keeping the server's"),
    ('--temperature / --top-k / --top-p / --min-p',
     "request defaults (a request's own values win)"),
    ('--repeat-penalty / --repeat-last-n / --presence-penalty / --frequency-penalty',
     'request defaults'),
    ('--seed',
     'the seed of requests that send none (-1: random)'),
    ('--log-level',
     'debug, info, warning, error'),
    ('--verbose',
     "log everything, llama.cpp's log included (as `--log-level debug`)"),
    ('--version',
     'print the version (warmslot, llama-cpp-python and the llama.cpp commit) and exit'),
    ('--no-webui',
     'no web page at `/` (404), as in llama-server'),
    ('--jinja, --metrics, --slots, --cont-batching',
     'accepted for llama-server compatibility and logged as having no effect: templates always run with '
     'Jinja, `/metrics` is always on, `/slots` is on unless `--no-slots`, batching is always continuous'),
    ('--reasoning',
     "`on` / `off` set the chat template's `enable_thinking` (`off` also closes a think block the template"
     ' always opens, as llama-server does); `auto` sets it on where the template has that switch, as '
     "llama-server does; a request's `chat_template_kwargs` override it"),
    ('--api-key-file',
     "a file of API keys, one per line (blank lines and `#` lines skipped), added to `--api-key`'s"),
    ('--cors-origins',
     "origins whose web pages may call the server from a browser: `*` (any: the request's `Origin` is "
     'echoed back while credentials are allowed, as llama-server does), `localhost` (pages on this machine'
     ' only), or a comma-separated list. Preflights (`OPTIONS`) are answered before the key check'),
    ('--cors-methods / --cors-headers',
     'what a CORS preflight allows'),
    ('--cors-credentials / --no-cors-credentials',
     'whether CORS preflights allow credentials'),
    ('--tags',
     'comma-separated tags of the model, listed on `/v1/models` (informational)'),
    ('--spec-type',
     "speculative decoding: `draft` or llama-server's `draft-simple` (with `-md`), `draft-mtp` (the "
     "model's own multi-token-prediction layers), or `ngram-simple`, which drafts from the slot's own "
     'prompt and output (the tokens that followed the last earlier occurrence of its last '
     "`--spec-ngram-size-n` tokens), verified in the same decode step as the other slots' tokens; see "
     '[Speculative decoding](speculative-decoding.md)'),
    ('--draft-max / --draft-n-min',
     'most tokens drafted per step (0: none) / a shorter draft is not used'),
    ('--draft-p-min',
     'a draft model stops drafting before a token it gives less probability; n-gram drafts have no '
     'probabilities'),
    ('--spec-ngram-size-n / --spec-ngram-size-m',
     '`ngram-simple`: tokens of the n-gram looked up / most tokens drafted after a match (before '
     '`--draft-max`)'),
    ('--spec-ngram-size-min',
     '`ngram-simple`: the shortest n-gram looked up where the last `--spec-ngram-size-n` tokens did not '
     'occur before; its draft stops where its two latest occurrences were followed differently (equal to '
     '`-n`: that length alone)'),
    ('--spec-ngram-memory',
     "`ngram-simple`: tokens of earlier requests' outputs kept and drafted from where the slot's own "
     'history has no match (same tenant only; 0: none)'),
    ('--spec-rs-snapshots',
     "recurrent and hybrid models: recurrent states kept per sequence after its last tokens (llama.cpp's "
     '`n_rs_seq`), so a draft of up to that many tokens rolls back with `seq_rm` alone; every step writes '
     'them, and each costs one more recurrent state per sequence (-1: 4 with a draft model or MTP, 0 with '
     'n-grams; 0: state copies only)'),
    ('--model-draft',
     'a draft model of the same vocabulary (sets `--spec-type draft`): it drafts greedily, up to '
     '`--draft-max` tokens, while each is at least `--draft-p-min` likely; its KV cache follows each '
     "slot's tokens by their common prefix"),
    ('--gpu-layers-draft / --cache-type-k-draft / --cache-type-v-draft',
     "the draft model's GPU layers (-1: all) and KV cache types"),
    ('--device-draft',
     'comma-separated devices for the draft model, named as `--list-devices` shows them (`none`: the CPU)'),
    ('--lora',
     'a LoRA adapter GGUF for the model, at scale 1 (comma-separated for several; repeatable). An '
     "adapter's id is its place: `--lora`'s in order, then `--lora-scaled`'s. A request picks adapters and "
     'scales with `"lora": [{"id": 0, "scale": 0.5}]`; `GET /lora-adapters` lists them, `POST '
     "/lora-adapters` (admin key) sets the scales of requests that name none. Cached state is kept apart "
     'by adapter set; not with speculative decoding or `--mmproj` (see [api.md](api.md#lora-adapters))'),
    ('--lora-scaled',
     '`FNAME:SCALE,...`: LoRA adapters at the given scales (repeatable)'),
    ('--lora-init-without-apply',
     'the adapters start at scale 0: requests run on the base model until `POST /lora-adapters` or a '
     'request\'s `"lora"` sets scales'),
]

INTRO = """\
# Flags

Flags are named like llama-server's. Each has an environment variable `WARMSLOT_<NAME>`
(e.g. `WARMSLOT_CTX_SIZE=16384`); `warmslot --help` lists them all.

<!-- Generated from server/process/flags.py and server/process/flags_doc.py by
python -m warmslot.server.process.flags_doc: edit those, not this page. -->
"""

AFTER = """\
**Every other llama-server flag** is accepted with a logged reason, refused with a message that
names the flag and the reason, or is another name for one of the flags above: the whole list is
in [llama-server-flags.md](llama-server-flags.md). None gets argparse's
"unrecognized" or "ambiguous option" error. `--host` takes several addresses, comma-separated
(`--host 127.0.0.1,::1`).

**Sizes** (`--cache-ram`, `--checkpoint-ram`, `--cache-vram`): a bare number is MiB, as
llama-server reads `--cache-ram` (`8192` is 8 GiB); a unit makes it explicit: `8GiB`,
`512MiB`, `2G`, `4096B`. K, M, G and T are powers of 1024.

**Start-up.** warmslot binds its port first: a busy port ends it at once with exit code 1
and a message, before anything loads. It logs its URL once, then loads the model (`/health`
answers 503 meanwhile) and logs a capacity table: the context and how it was chosen, the
weights per device, the KV cache per device and per token, the recurrent state per sequence
(recurrent and hybrid models), the compute buffers, the checkpoint budget, the prompt cache
budget (also what `auto` became) and the pinned host memory. `/props` and `/engine` show the
same table as `capacity`.
"""


def _size(text: str) -> str:
    """A size default as the page shows it: `auto`, or the bytes in the largest unit that divides them."""
    if str(text).strip().lower() == "auto":
        return "auto"
    n = parse_size(text)
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def default_shown(flag: Flag) -> str:
    """The default column: the row's `default_text`, else what leaving the flag unset gives:
    off or on for a switch, none for an unset value, nothing for a flag that only exists for
    llama-server's sake, else the value (tests/project/test_docs.py reads it back)."""
    if flag.default_text is not None:
        return flag.default_text
    if flag.kind == NOOP:
        return ""
    if flag.kind is bool:
        return "on" if flag.default else "off"
    if flag.kind in (ON, OFF):
        return flag.default
    if flag.default is None:
        return "none"
    if flag.kind == SIZE:
        return f"`{_size(flag.default)}`"
    if flag.kind is float:
        return f"`{flag.default:g}`"
    return f"`{flag.default}`"


def _by_name() -> dict[str, Flag]:
    return {name: flag for flag in FLAGS for name in flag.names}


def _row(key: str, meaning: str, flags: dict[str, Flag], seen: list[Flag]) -> str:
    names, defaults = [], []
    for group in key.split(" / "):
        spans = []
        for long in group.split(", "):
            if long in OWN_FLAGS:
                spans.append(f"`{long}`")
                default = ""
                continue
            flag = flags[long]
            seen.append(flag)
            spans.append("`" + ", ".join(flag.names) + "`")
            default = default_shown(flag)
        names.append(", ".join(spans))
        defaults.append(default)
    shown = defaults[0] if len(set(defaults)) == 1 else " / ".join(defaults)
    return f"| {' / '.join(names)} | {shown} | {meaning} |"


def flags_markdown() -> str:
    """docs/flags.md: the intro, the table (a row for each entry of ROWS) and the notes after it."""
    flags, seen = _by_name(), []
    table = [_row(key, meaning, flags, seen) for key, meaning in ROWS]
    missing = [flag.names for flag in FLAGS if flag not in seen]
    twice = [flag.names for flag in FLAGS if seen.count(flag) > 1]
    if missing or twice:
        raise ValueError(f"flags_doc.ROWS: flags without a row {missing}, flags in several rows {twice}")
    lines = [INTRO, "| flag | default | meaning |", "|---|---|---|", *table, "", AFTER]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write docs/flags.md (or the path given) from the flag table."""
    args = sys.argv[1:] if argv is None else argv
    path = pathlib.Path(args[0] if args else PAGE)
    path.write_text(flags_markdown())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
