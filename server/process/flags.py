"""The command-line flags, one row each: the one place a flag is written down.

A `Flag` row holds everything about one flag:

- `names`: as llama-server spells them (short ones first);
- `dest`: the name argparse stores the value under; `WARMSLOT_<DEST>` is its environment
  variable (WARMSLOT_CTX_SIZE for --ctx-size), whose value becomes the default;
- `kind`: how its text is read: `int`, `float`, `str`, a parser from flag_values.py (device
  lists, tensor overrides), or one of
  `bool` (a switch; the environment variable is read as 1/true/yes/on),
  `SIZE` (flag_values.parse_size: a bare number is MiB; the default is converted too),
  `VRAM` (a size or auto),
  `NOOP` (a switch llama-server has that changes nothing here: it is logged, its reason the
  help text after the first ': '),
  `ON` / `OFF` (one of two switches that set a three-way setting to on or off; the
  environment variable takes on, off or auto);
- `default`: the value when neither the flag nor its environment variable is given (sizes as
  text, as a user writes them);
- `sets`: the config field that takes the value as it is, as a dotted path from ServerConfig
  (`"port"`, `"engine.n_ctx"`, `"sampling.top_k"`, `"engine.spec.n_max"`): config.py copies
  these without naming them again;
- `feeds`: instead of `sets`, the config field that config.py (engine_settings.py for the
  engine) computes from this flag: clamped, negated, split into a list, or combined with others;
- `choices`, `repeatable` (each use adds to a list), `help` (for --help, which adds the
  environment variable);
- `default_text`: the default as the flag reference (docs/flags.md) states it, where that is not the value
  itself (what leaving the flag unset means: `all`, `off`, `the GGUF's`).

What is made from the table or held to it:

- flag_parser.build_parser() makes the argparse parser from the rows (then adds the
  llama-server flags that warmslot does not implement, llama_flags.py);
- config.parse_config() copies every `sets` flag into its field (flag_parser.copied); the
  `feeds` fields are its logic;
- tests/suite/test_dropin_flags.py checks that every `sets`/`feeds` path is a field of the config,
  that every field of ServerConfig is reached from a row (or is in a short list of fields that
  no flag sets), that its dataclass default is what the flags give when none is set, and that
  a value given to a `sets` flag arrives in its field;
- flags_doc.flags_markdown() makes docs/flags.md, the flag reference, from the rows and the words
  flags_doc.py holds for each flag; tests/project/test_flags_doc.py checks that the page is what it makes,
  and tests/project/test_docs.py that it lists every flag, under names that are its names, with its default
  (`default_text`, else the value).

ServerConfig stays a dataclass written out in config.py rather than one made from these rows
with `dataclasses.make_dataclass`: the whole server reads `config.<field>`, and a class written
out is what type checkers, editors and readers can see; several of its fields are not one
flag's value (the hosts, the CORS policy, Vertex AI's settings, the ignored flags), and several
flags feed one field. The tests above keep the two from drifting apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warmslot.slots import SPEC_TYPES, placement

from ..output.markers import FORMATS
from .flag_values import (
    SIZE_HELP, parse_device_names, parse_lora_files, parse_lora_scaled, parse_rpc_servers, parse_tensor_overrides,
    parse_tensor_split,
)

# kinds that are not a type or a parser (see the module docstring)
SIZE, VRAM, NOOP, ON, OFF = "size", "vram", "noop", "on", "off"

KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
ON_OFF = ("on", "off")
ON_OFF_AUTO = ("on", "off", "auto")
TOOL_FORMATS = ("auto",) + tuple(f for f in FORMATS if f != "none")


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    dest: str
    kind: Any  # a type, a parser, or SIZE, VRAM, NOOP, ON, OFF
    default: Any
    sets: str | None = None  # the config field that takes the value as it is
    feeds: str | None = None  # the config field computed from it (config.py, engine_settings.py)
    choices: tuple[str, ...] | None = None
    repeatable: bool = False
    default_text: str | None = None  # the reference's default, where it is not the value
    help: str = ""

    @property
    def env(self) -> str:
        """The environment variable that gives the default."""
        return "WARMSLOT_" + self.dest.upper()

    @property
    def field(self) -> str | None:
        """The config field this flag reaches, as it is or computed."""
        return self.sets or self.feeds


FLAGS = [
    Flag(("-m", "--model"), "model", str, None, feeds="engine.model_path",
         default_text="the embedded SmolLM2 135M Instruct (else Gemma 3 270M), if installed",
         help="path of the GGUF model (default: the embedded SmolLM2 135M Instruct, or Gemma 3 270M, if "
              "installed)"),
    Flag(("--host",), "host", str, "127.0.0.1", feeds="host",
         help="address to listen on; several separated by commas (e.g. 127.0.0.1,::1)"),
    Flag(("--port",), "port", int, 8080, feeds="port",
         help="port to listen on"),
    Flag(("-np", "--parallel"), "parallel", int, 4, sets="engine.n_parallel",
         help="number of slots (sequences decoded together)"),
    Flag(("-c", "--ctx-size"), "ctx_size", int, 0, sets="engine.n_ctx",
         help="KV cache size in tokens, shared by all slots (0: the model's training context if it fits the free "
              "device memory, or RAM on a CPU, else the largest that fits)"),
    Flag(("-ngl", "--n-gpu-layers"), "n_gpu_layers", int, None, feeds="engine.n_gpu_layers", default_text="all",
         help="layers to offload to the GPU (-1: all; default: all, or as many as fit with --fit on)"),
    Flag(("-sm", "--split-mode"), "split_mode", str, "layer", feeds="engine.placement",
         choices=tuple(placement.SPLIT_MODES),
         help="how to spread the model over several GPUs: none (one GPU, --main-gpu), layer (whole layers and "
              "their KV cache per GPU), row (weight rows across GPUs; KV cache and results on --main-gpu), tensor "
              "(experimental in llama.cpp)"),
    Flag(("-ts", "--tensor-split"), "tensor_split", parse_tensor_split, None, feeds="engine.placement",
         default_text="by free memory",
         help="proportion of the model for each GPU, e.g. 3,1 (default: in proportion to free memory)"),
    Flag(("-mg", "--main-gpu"), "main_gpu", int, 0, feeds="engine.placement",
         help="the GPU for the whole model with --split-mode none, or for the KV cache and results with row"),
    Flag(("-dev", "--device"), "device", parse_device_names, None, feeds="engine.placement",
         default_text="all GPUs",
         help="comma-separated devices to offload to, named as --list-devices shows them (none: no offload; "
              "default: all GPUs)"),
    Flag(("--list-devices",), "list_devices", bool, False, default_text="",
         help="print the devices the model can be offloaded to, with their memory, and exit"),
    Flag(("--rpc",), "rpc", parse_rpc_servers, None, feeds="engine.placement",
         help="comma-separated RPC servers (host:port) whose devices join the ones the model is spread over "
              "(needs llama-cpp-python built with -DGGML_RPC=on)"),
    Flag(("-fa", "--flash-attn"), "flash_attn", str, "auto", sets="engine.flash_attn", choices=ON_OFF_AUTO,
         help="flash attention: on, off or auto"),
    Flag(("-ctk", "--cache-type-k"), "cache_type_k", str, "f16", sets="engine.type_k", choices=KV_TYPES,
         help="KV cache type for K (f16, bf16, q8_0, q4_0, ...)"),
    Flag(("-ctv", "--cache-type-v"), "cache_type_v", str, "f16", sets="engine.type_v", choices=KV_TYPES,
         help="KV cache type for V"),
    Flag(("-b", "--batch-size"), "batch_size", int, 2048, sets="engine.n_batch",
         help="logical batch size: tokens per decode step"),
    Flag(("-ub", "--ubatch-size"), "ubatch_size", int, 512, sets="engine.n_ubatch",
         help="physical batch size"),
    Flag(("-t", "--threads"), "threads", int, 0, sets="engine.n_threads",
         help="CPU threads for generation (0: the number of physical cores)"),
    Flag(("-tb", "--threads-batch"), "threads_batch", int, 0, sets="engine.n_threads_batch",
         help="CPU threads for prompt processing (0: same as --threads)"),
    Flag(("-n", "--n-predict"), "n_predict", int, -1, sets="n_predict",
         help="default max_tokens when a request sets none (-1: until the context is full)"),
    Flag(("--chat-template",), "chat_template", str, None, feeds="chat_template", default_text="the GGUF's",
         help="a Jinja chat template file, or a built-in by name: warmslot's Jinja gemma, chatml, llama3, "
              "mistral, or one of llama.cpp's own formats (command-r, llama2, phi3, zephyr, ...), which llama.cpp "
              "renders"),
    Flag(("-a", "--alias"), "alias", str, None, feeds="alias",
         default_text="the file name (`-hf`: the repository)",
         help="model name to report in the API (default: the file name); several names separated by commas, the "
              "first is reported"),
    Flag(("--api-key",), "api_key", str, None, feeds="api_keys",
         help="require this key (Authorization: Bearer KEY); several keys separated by commas"),
    Flag(("--api-key-file",), "api_key_file", str, None, feeds="api_keys",
         help="a file of API keys, one per line (blank lines and lines starting with # are skipped), added to "
              "--api-key's"),
    Flag(("--cors-origins",), "cors_origins", str, "*", feeds="cors",
         help="origins whose web pages may call the server from a browser: * (any: the request's Origin is echoed "
              "back while --cors-credentials is on), localhost (pages on this machine only), or a "
              "comma-separated list"),
    Flag(("--cors-methods",), "cors_methods", str, "GET, POST, DELETE, OPTIONS", feeds="cors",
         help="methods a CORS preflight allows"),
    Flag(("--cors-headers",), "cors_headers", str, "*", feeds="cors",
         help="headers a CORS preflight allows"),
    Flag(("--cors-credentials",), "cors_credentials", ON, "on", feeds="cors",
         help="CORS preflights allow credentials (the default)"),
    Flag(("--no-cors-credentials",), "cors_credentials", OFF, "on", feeds="cors",
         help="CORS preflights do not allow credentials; with --cors-origins * the origin is then '*'"),
    Flag(("--tags",), "tags", str, None, feeds="tags",
         help="comma-separated tags of the model, listed on /v1/models (informational)"),
    Flag(("--max-queue",), "max_queue", int, 64, sets="engine.max_queue",
         help="requests that may wait for a slot; more get 503 with Retry-After"),
    Flag(("--admin-key",), "admin_key", str, None, feeds="admin_key", default_text="the first `--api-key`",
         help="the key that sees every tenant's slots and cache entries on /slots and /engine and reads /metrics "
              "(default: the first --api-key)"),
    Flag(("--metrics-open",), "metrics_open", bool, False, sets="metrics_open",
         help="serve /metrics without a key even when --api-key is set (anyone who reaches the port reads the "
              "model path and the load)"),
    Flag(("--max-body",), "max_body", SIZE, "8MiB", sets="max_body",
         help="largest request body; larger bodies get 413 (0: no limit); " + SIZE_HELP),
    Flag(("--request-timeout",), "request_timeout", float, 0.0, feeds="request_timeout",
         help="seconds a request may take from arrival to its last token; a request's own 'timeout' can only "
              "shorten it (0: no limit)"),
    Flag(("--shutdown-timeout",), "shutdown_timeout", float, 30.0, feeds="shutdown_timeout",
         help="seconds running requests get to finish after SIGTERM before they end with an error"),
    Flag(("--sleep-idle-seconds",), "sleep_idle_seconds", float, -1.0, feeds="sleep_idle_s", default_text="off",
         help="unload the model after this many seconds without a request, keeping the prompt cache and the disk "
              "tier; the next request that needs the model loads it again (-1: never); with several models, each "
              "model's default keep-alive"),
    Flag(("--models-dir",), "models_dir", str, None, sets="models_dir",
         help="serve every model of this folder by name, loaded when a request names it: a GGUF at the top is a "
              "model named by its file, a subfolder a model named by the folder (its projector the mmproj*.gguf "
              "beside it), as llama-server lays it out"),
    Flag(("--models-file", "--models-preset"), "models_file", str, None, sets="models_file",
         help="an INI file of models: a section a model (its name), with model = PATH, alias = names or wildcards "
              "(claude-*haiku*), keep-alive and any flag of the server without its dashes (ctx-size = 8192)"),
    Flag(("--models-max",), "models_max", int, 4, sets="models_max",
         help="models loaded at once (--models-dir, --models-file); the least recently used idle one is unloaded "
              "to load another, its conversations kept in its prompt cache"),
    Flag(("--models-default",), "models_default", str, None, sets="models_default", default_text="none: 404",
         help="the model that answers a name no model matches (default: such a request gets 404)"),
    Flag(("--models-load-timeout",), "models_load_timeout", float, 300.0, sets="models_load_timeout",
         help="seconds a request waits for its model to load (or for room to load it) before a 503 with Retry-After"),
    Flag(("--swa-full",), "swa_full", bool, False, sets="engine.swa_full",
         help="keep the full KV cache on sliding-window models (more memory, no checkpoints needed)"),
    Flag(("-ctxcp", "--ctx-checkpoints"), "ctx_checkpoints", int, 32, feeds="engine.ctx_checkpoints",
         help="checkpoints kept per slot on non-truncatable models"),
    Flag(("--checkpoint-every",), "checkpoint_every", int, 8192, sets="engine.checkpoint_every",
         help="tokens between checkpoints inside a long prefill (0: only at message starts)"),
    Flag(("--checkpoint-ram",), "checkpoint_ram", SIZE, "4GiB", sets="engine.checkpoint_bytes",
         help="memory for checkpoints per slot; " + SIZE_HELP),
    Flag(("--quick-tokens",), "quick_tokens", int, 512, sets="engine.quick_tokens",
         help="with a stream per sequence, a request that continues a conversation an idle sequence on the device holds, computing at most this "
              "many new tokens, starts at once beside --parallel running ones (up to twice --parallel; 0: it waits)"),
    Flag(("--cache-reuse",), "cache_reuse", int, 0, sets="engine.cache_reuse", default_text="0 (off)",
         help="shift the KV of chunks of at least this many tokens that moved in a slot's prompt (an edit above "
              "the cursor) instead of computing them again: approximate, attention models only (0: off)"),
    Flag(("-cram", "--cache-ram"), "cache_ram", SIZE, "auto", sets="engine.cache_ram",
         help="RAM for the prompt cache (0: off; auto: a quarter of the RAM, at most 32GiB); " + SIZE_HELP),
    Flag(("--cache-vram",), "cache_vram", VRAM, "auto", sets="engine.cache_vram",
         help="device memory for spare sequences that keep idle conversations on the GPU, a size ("
              + SIZE_HELP + ") or auto (0: none). With a stream per slot (attention models) each spare is a "
              "stream (sliding-window models too, and hybrid models, with a recurrent state each); auto: as many as free device memory "
              "holds after a margin (at most 16 per slot and 64 in all; on the CPU, where they are RAM, as many as a quarter of "
              "--cache-ram holds, at most 3 per slot, taken from it). Recurrent and hybrid models in one pool get two spare "
              "sequences per slot in it; attention models in one pool only with a size: idle conversations keep up to that "
              "much of cells in the pool, sharing prefixes"),
    Flag(("--cache-disk",), "cache_disk", str, None, sets="engine.cache_disk", default_text="off",
         help="directory of the disk tier: prompt-cache entries evicted from RAM, and those worth keeping at "
              "shutdown, are written there and survive restarts (created owner-only; default: off)"),
    Flag(("--cache-disk-size",), "cache_disk_size", str, "auto", feeds="engine.cache_disk_size",
         help="byte budget of --cache-disk (auto: half the free space, at most 64GiB); " + SIZE_HELP),
    Flag(("--slot-save-path",), "slot_save_path", str, None, sets="slot_save_path", default_text="off",
         help="directory for POST /slots/{id}?action=save|restore|erase and its 'filename' (as llama-server's); "
              "it must exist"),
    Flag(("--slot-save-size",), "slot_save_size", SIZE, "4GiB", sets="slot_save_size",
         help="most bytes the files in --slot-save-path may take; a save past it gets 507 (without --api-key, "
              "slot files are off unless --slot-save-path is given); " + SIZE_HELP),
    Flag(("--max-messages",), "max_messages", int, 10000, sets="max_messages",
         help="most messages in one chat request or one Responses conversation (stored history plus input items); "
              "more get 400 naming the field (0: no limit)"),
    Flag(("--max-tools",), "max_tools", int, 256, sets="max_tools",
         help="most tools in one request; more get 400 naming 'tools' (0: no limit)"),
    Flag(("--prefill-chunk",), "prefill_chunk", int, 0, sets="engine.prefill_chunk",
         help="prompt tokens per step while other slots generate (0: --ubatch-size)"),
    Flag(("-kvu", "--kv-unified"), "kv_unified", ON, "auto", sets="engine.kv_unified",
         help="one KV pool that all slots share, so one slot may use all of it (default with one slot, and on "
              "recurrent and hybrid models)"),
    Flag(("-no-kvu", "--no-kv-unified"), "kv_unified", OFF, "auto", sets="engine.kv_unified",
         help="a KV stream of --ctx-size/--parallel cells per slot (default with several slots on attention and "
              "sliding-window models) [env value: on, off or auto]"),
    Flag(("--no-cache-segments",), "no_cache_segments", bool, False, feeds="engine.cache_segments",
         help="store every prompt-cache entry whole (by default, on attention, sliding-window and hybrid models, an entry that shares a prefix "
              "with another stores only its own tokens' state, chained to it)"),
    Flag(("--no-park-idle",), "no_park_idle", bool, False, feeds="engine.park_idle",
         help="keep idle slots' contents in the KV pool when another request starts (they slow down its decoding)"),
    Flag(("--no-slots",), "no_slots", bool, False, feeds="slots_endpoint",
         help="disable the /slots and /engine endpoints (they answer 501)"),
    Flag(("--no-webui",), "no_webui", bool, False, feeds="webui",
         help="no web page at / (the chat and cache view)"),
    Flag(("--tool-format",), "tool_format", str, "auto", sets="tool_format", choices=TOOL_FORMATS,
         help="tool-call format: auto (from the chat template), hermes, hermes_xml, llama3, mistral, json"),
    Flag(("-rea", "--reasoning"), "reasoning", str, "auto", sets="reasoning_default", choices=ON_OFF_AUTO,
         help="thinking in chat replies: on or off set the chat template's enable_thinking (off also closes a "
              "think block the template always opens); auto: on where the template has an enable_thinking switch "
              "(as llama-server), else the template's default. A request's chat_template_kwargs override it"),
    Flag(("--reasoning-format",), "reasoning_format", str, "auto", sets="reasoning_format",
         choices=("auto", "deepseek", "none"),
         help="auto: thoughts go to reasoning_content when the chat template uses <think>; deepseek: always; "
              "none: leave them in content"),
    Flag(("--log-level",), "log_level", str, "info", feeds="log_level",
         choices=("debug", "info", "warning", "error"),
         help="debug, info, warning or error"),
    Flag(("--max-n",), "max_n", int, 8, sets="max_n",
         help="most choices one request may ask for (n); the prompt is evaluated once and forked into the others"),
    Flag(("--embeddings",), "embeddings", bool, False, sets="engine.embeddings",
         help="serve /v1/embeddings from a second llama context with embeddings on (generation is unaffected)"),
    Flag(("--rerank", "--reranking"), "reranking", bool, False, sets="engine.reranking",
         help="serve /rerank (and /v1/rerank) from a context with rank pooling: relevance scores of "
              "query-document pairs from a reranker model"),
    Flag(("--pooling",), "pooling", str, "auto", sets="engine.pooling",
         choices=("auto", "mean", "cls", "last", "none"),
         help="embedding pooling: auto (the model's own; mean when it declares none), mean, cls, last, or none (a "
              "vector per token: /embeddings only, /v1/embeddings refuses it)"),
    Flag(("--responses-store",), "responses_store", int, 256, sets="responses_store",
         help="responses kept per tenant for previous_response_id (/v1/responses); older ones are evicted"),
    Flag(("--responses-secret",), "responses_secret", str, None, sets="responses_secret", default_text="random",
         help="the secret that signs the turn in a /v1/responses reasoning item's encrypted_content; the same "
              "secret on every replica, or across restarts, keeps clients' histories reusable (default: a random "
              "one per process: after a restart old blobs are ignored)"),
    Flag(("--spm-infill",), "spm_infill", bool, False, sets="spm_infill",
         help="/infill lays the prompt out suffix-prefix-middle, for models trained that way (default: "
              "prefix-suffix-middle)"),
    Flag(("--keep-billing-header",), "keep_billing_header", bool, False, sets="keep_billing_header",
         help="/v1/messages: keep Claude Code's x-anthropic-billing-header system block in the prompt (it changes "
              "on every request, so every request then recomputes the whole prompt; dropped by default)"),
    # Flags llama-server users type: its sampling defaults, reasoning, model download, and flags
    # for what warmslot always does (accepted, with a log line that they change nothing).
    Flag(("--chat-template-file",), "chat_template_file", str, None, feeds="chat_template",
         help="a Jinja chat template file (as --chat-template FILE)"),
    Flag(("--chat-template-kwargs",), "chat_template_kwargs", str, None, feeds="chat_template_kwargs",
         help="a JSON object of chat template variables for every request, e.g. '{\"enable_thinking\": false}'; a "
              "request's chat_template_kwargs override them"),
    Flag(("--no-mmap",), "no_mmap", bool, False, feeds="engine.use_mmap",
         help="read the weights into memory instead of mapping the file"),
    Flag(("--mlock",), "mlock", bool, False, sets="engine.use_mlock",
         help="keep the weights in RAM (never swapped out)"),
    Flag(("--repack",), "repack", bool, False, feeds="engine.repack",
         help="repack weights for llama.cpp's CPU kernels (AMX, interleaved quants): their batched sums differ "
              "from one token's, so a cached conversation may answer otherwise than cold"),
    Flag(("-nr", "--no-repack"), "no_repack", bool, False, feeds="engine.repack",
         help="no weight repacking on the CPU (the default)"),
    Flag(("-s", "--seed"), "seed", int, -1, feeds="sampling.seed",
         help="default sampling seed of requests that send none (-1: random)"),
    Flag(("--temp", "--temperature"), "temp", float, 0.8, feeds="sampling.temperature",
         help="default temperature"),
    Flag(("--top-k",), "top_k", int, 40, sets="sampling.top_k",
         help="default top-k (0: off)"),
    Flag(("--top-p",), "top_p", float, 0.95, sets="sampling.top_p",
         help="default top-p (1.0: off)"),
    Flag(("--min-p",), "min_p", float, 0.05, sets="sampling.min_p",
         help="default min-p (0.0: off)"),
    Flag(("--repeat-last-n",), "repeat_last_n", int, 64, sets="sampling.repeat_last_n",
         help="default number of recent tokens the penalties look at"),
    Flag(("--repeat-penalty",), "repeat_penalty", float, 1.0, sets="sampling.repeat_penalty",
         help="default repeat penalty (1.0: off)"),
    Flag(("--presence-penalty",), "presence_penalty", float, 0.0, sets="sampling.presence_penalty",
         help="default presence penalty (0.0: off)"),
    Flag(("--frequency-penalty",), "frequency_penalty", float, 0.0, sets="sampling.frequency_penalty",
         help="default frequency penalty (0.0: off)"),
    Flag(("--reasoning-budget",), "reasoning_budget", int, -1, sets="reasoning_budget",
         help="tokens a reply may think before </think> is forced (-1: no limit, 0: end thinking at once)"),
    Flag(("-hf", "-hfr", "--hf-repo"), "hf_repo", str, None, sets="hf_repo",
         help="download the model from Hugging Face: USER/REPO[:QUANT] (quant default Q4_K_M, else the first "
              "GGUF), into its cache"),
    Flag(("-hff", "--hf-file"), "hf_file", str, None, sets="hf_file",
         help="the GGUF file of --hf-repo to download (overrides the quant)"),
    Flag(("-hft", "--hf-token"), "hf_token", str, None, sets="hf_token", default_text="`HF_TOKEN`",
         help="Hugging Face token (default: HF_TOKEN or the saved login)"),
    Flag(("-v", "--verbose"), "verbose", bool, False, feeds="log_level",
         help="log everything, llama.cpp included (as --log-level debug)"),
    Flag(("--jinja",), "jinja", NOOP, False, feeds="ignored_flags",
         help="accepted for llama-server compatibility: chat templates always run with Jinja"),
    Flag(("--metrics",), "metrics", NOOP, False, feeds="ignored_flags",
         help="accepted for llama-server compatibility: /metrics is always on"),
    Flag(("--slots",), "slots", NOOP, False, feeds="ignored_flags",
         help="accepted for llama-server compatibility: /slots is on unless --no-slots"),
    Flag(("-cb", "--cont-batching"), "cont_batching", NOOP, False, feeds="ignored_flags",
         help="accepted for llama-server compatibility: batching is always continuous"),
    # Images in chat messages (a vision projector beside the model, through libmtmd).
    Flag(("-mm", "--mmproj"), "mmproj", str, None, sets="engine.mmproj",
         help="a multimodal projector GGUF for the model: chat messages may then hold images (image_url data: "
              "URLs)"),
    Flag(("--no-mmproj-offload",), "no_mmproj_offload", bool, False, feeds="engine.mmproj_offload",
         help="keep the projector on the CPU"),
    Flag(("--image-min-tokens",), "image_min_tokens", int, -1, sets="engine.image_min_tokens",
         help="fewest tokens an image takes, for projectors of dynamic resolution (-1: the projector's own)"),
    Flag(("--image-max-tokens",), "image_max_tokens", int, -1, sets="engine.image_max_tokens",
         help="most tokens an image takes, for projectors of dynamic resolution (-1: the projector's own)"),
    Flag(("--image-max-bytes",), "image_max_bytes", SIZE, "20m", sets="image_max_bytes",
         help="largest image or audio clip accepted, decoded (a bare number is MiB); more get 400"),
    Flag(("--image-max-pixels",), "image_max_pixels", int, 33554432, sets="image_max_pixels",
         help="most pixels (width x height) of an image accepted; more get 400"),
    Flag(("--media-path",), "media_path", str, None, sets="media_path", default_text="off",
         help="a folder that image_url file:// URLs are read from (paths inside it only); without it they get 400"),
    Flag(("--image-fetch",), "image_fetch", bool, False, sets="image_fetch",
         help="fetch http(s) image URLs (within --image-max-bytes and --image-fetch-timeout); without it they get "
              "400"),
    Flag(("--image-fetch-timeout",), "image_fetch_timeout", float, 10.0, feeds="image_fetch_timeout",
         help="seconds an image fetch may take in all"),
    Flag(("--no-mmproj", "--no-mmproj-auto"), "no_mmproj", bool, False, sets="no_mmproj",
         help="-hf: do not download the repository's projector (mmproj) beside the model"),
    # Expert offload, tensor placement and --fit (llama-server's names and meanings).
    Flag(("-cmoe", "--cpu-moe"), "cpu_moe", bool, False, feeds="engine.placement",
         help="keep the experts of every layer of a mixture-of-experts model in RAM (tensors matching "
              "\\.ffn_(up|down|gate)_exps)"),
    Flag(("-ncmoe", "--n-cpu-moe"), "n_cpu_moe", int, 0, feeds="engine.placement",
         help="keep the experts of the first N layers in RAM"),
    Flag(("-ot", "--override-tensor"), "override_tensor", parse_tensor_overrides, None, feeds="engine.placement",
         repeatable=True,
         help="PATTERN=BUFFER,...: tensors whose name the regular expression finds go to that buffer type (CPU, "
              "CUDA0, ...; the first match wins); repeatable"),
    Flag(("--fit",), "fit", str, "on", feeds="engine.fit", choices=ON_OFF,
         help="on: what is left unset (the context, expert placement, GPU layers) is chosen to fit the free "
              "device memory with --fit-target; off: load as set"),
    Flag(("-fitt", "--fit-target"), "fit_target", int, 1024, feeds="engine.fit_target",
         help="MiB left free on each device by --fit (one value for every device), and the margin of the capacity "
              "answer"),
    Flag(("-fitc", "--fit-ctx"), "fit_ctx", int, 4096, sets="engine.fit_ctx",
         help="the smallest context --fit may choose"),
    Flag(("--fit-print",), "fit_print", bool, False, default_text="",
         help="load the model, print the capacity table and what the server can hold (largest context per slot, "
              "most slots, prompt cache RAM), and exit without serving"),
    # Speculative decoding (llama-server's names; see slots/speculation/spec_config.py).
    Flag(("--spec-type",), "spec_type", str, "none", feeds="engine.spec.type", choices=SPEC_TYPES,
         help="speculative decoding: none; ngram-simple (drafts from the slot's own prompt and output: the tokens "
              "that followed the last earlier occurrence of the last --spec-ngram-size-n tokens); draft or "
              "draft-simple (a draft model, -md); draft-mtp (the model's own MTP layers)"),
    Flag(("--draft", "--draft-n", "--draft-max"), "draft_max", int, 64, sets="engine.spec.n_max",
         help="most tokens drafted per step (0: no drafting)"),
    Flag(("--draft-min", "--draft-n-min"), "draft_min", int, 0, sets="engine.spec.n_min",
         help="a shorter draft is not used"),
    Flag(("--draft-p-min",), "draft_p_min", float, 0.75, sets="engine.spec.p_min",
         help="a draft model stops drafting before a token it gives less probability (n-gram drafts have none)"),
    Flag(("--spec-ngram-size-n",), "spec_ngram_size_n", int, 12, sets="engine.spec.ngram_n",
         help="ngram-simple: tokens of the n-gram looked up in the slot's history"),
    Flag(("--spec-ngram-size-m",), "spec_ngram_size_m", int, 48, sets="engine.spec.ngram_m",
         help="ngram-simple: most tokens drafted after a match (before --draft-max)"),
    Flag(("--spec-ngram-size-min",), "spec_ngram_size_min", int, 3, sets="engine.spec.ngram_min",
         help="ngram-simple: the shortest n-gram looked up where the last --spec-ngram-size-n tokens did not "
              "occur before (equal to -n: only that length)"),
    Flag(("--spec-ngram-memory",), "spec_ngram_memory", int, 65536, sets="engine.spec.ngram_memory",
         help="ngram-simple: tokens of earlier requests' outputs kept, drafted from where the slot's history has "
              "no match (same tenant only; 0: none)"),
    Flag(("--spec-rs-snapshots",), "spec_rs_snapshots", int, -1, sets="engine.spec.rs_snapshots",
         help="recurrent and hybrid models: recurrent states kept per sequence after its last tokens, so a draft "
              "of up to that many tokens rolls back without a state copy; every step writes them, and each costs "
              "one more recurrent state per sequence (-1: 4 with a draft model or MTP, 0 with n-grams; 0: state "
              "copies only)"),
    Flag(("-md", "--model-draft"), "model_draft", str, None, feeds="engine.spec.draft_model",
         help="a draft model for speculative decoding (same vocabulary; sets --spec-type draft): it drafts "
              "greedily while each token is at least --draft-p-min likely"),
    Flag(("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), "gpu_layers_draft", int, -1,
         sets="engine.spec.draft_gpu_layers",
         help="layers of the draft model on the GPU (-1: all)"),
    Flag(("-devd", "--device-draft"), "device_draft", parse_device_names, None,
         feeds="engine.spec.draft_devices", default_text="`-dev`'s",
         help="comma-separated devices for the draft model, named as --list-devices shows them (none: the CPU; "
              "default: -dev's)"),
    Flag(("-ctkd", "--cache-type-k-draft"), "cache_type_k_draft", str, "f16", sets="engine.spec.draft_type_k",
         choices=KV_TYPES,
         help="KV cache type for K of the draft model"),
    Flag(("-ctvd", "--cache-type-v-draft"), "cache_type_v_draft", str, "f16", sets="engine.spec.draft_type_v",
         choices=KV_TYPES,
         help="KV cache type for V of the draft model"),
    # LoRA adapters (llama-server's flags; ids in the order given: --lora's, then --lora-scaled's).
    Flag(("--lora",), "lora", parse_lora_files, None, feeds="engine.lora", repeatable=True, default_text="none",
         help="a LoRA adapter GGUF for the model, at scale 1 (comma-separated for several); repeatable. Requests "
              "choose adapters and scales with \"lora\"; GET and POST /lora-adapters list them and set the "
              "default"),
    Flag(("--lora-scaled",), "lora_scaled", parse_lora_scaled, None, feeds="engine.lora", repeatable=True,
         default_text="none",
         help="FNAME:SCALE,...: LoRA adapters at the given scales; repeatable"),
    Flag(("--lora-init-without-apply",), "lora_init_without_apply", bool, False, feeds="engine.lora",
         help="load the LoRA adapters at scale 0: requests run on the base model until POST /lora-adapters (or a "
              "request's \"lora\") sets scales"),
]
