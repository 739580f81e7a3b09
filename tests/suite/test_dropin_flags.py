"""llama-server's flags and error wording, without a model: the flag table and the config it
fills, sizes in MiB, the sampling defaults, flags that change nothing, the context-overflow
error as litellm and hermes-agent classify it, the default context, the reasoning budget, the
Hub file choice and cut tool calls."""

import dataclasses
import os
import re

import pytest

from warmslot.server.process.config import AutoSize, ServerConfig, build_parser, parse_config, parse_size
from warmslot.server.process.flags import FLAGS, OFF, ON, SIZE, VRAM
from warmslot.server.errors import ContextOverflow
from warmslot.server.process.hub import HubError, HubModel, choose_file, split_parts
from warmslot.server.output.parser import OutputParser
from warmslot.server.request.protocol import parse_generation
from warmslot.slots.fitting.capacity import buffers_by_device
from warmslot.slots.fitting.context_size import ContextSource, choose_context
from warmslot.slots.sampling.reasoning_budget import BudgetState, Phase, ReasoningBudget

MiB, GiB = 1 << 20, 1 << 30


# -- the flag table and the config ---------------------------------------------------------

# ServerConfig's fields that no row of the table names, and where they come from instead
NOT_FROM_A_ROW = {
    "vertex": "Vertex AI's AIP_* environment (vertex_settings.py)",
    "hosts": "--host, split at its commas ([] where built by hand: host alone)",
    "aliases": "--alias, split at its commas",
}


@pytest.fixture
def no_environment(monkeypatch):
    """No WARMSLOT_* or AIP_* variable: the table's defaults alone."""
    for name in os.environ:
        if name.startswith(("WARMSLOT_", "AIP_")):
            monkeypatch.delenv(name)


def _field(config, path: str):
    """The object holding a dotted field of the config, and the field's name (asserting it is one)."""
    *owners, name = path.split(".")
    obj = config
    for owner in owners:
        obj = getattr(obj, owner)
    assert name in {f.name for f in dataclasses.fields(obj)}, f"{path} is not a field of {type(obj).__name__}"
    return obj, name


def test_each_row_of_the_flag_table_names_a_field_of_the_config(no_environment):
    config, _ = parse_config([])
    names = [name for flag in FLAGS for name in flag.names]
    assert len(names) == len(set(names)), "a flag name is in two rows"
    for flag in FLAGS:
        assert not (flag.sets and flag.feeds), flag.names
        if flag.field is not None:
            _field(config, flag.field)
    reached = {flag.field.split(".")[0] for flag in FLAGS if flag.field}
    fields = {f.name for f in dataclasses.fields(ServerConfig)}
    assert fields - reached == set(NOT_FROM_A_ROW), "a field of ServerConfig that no flag reaches"


def test_server_config_defaults_are_what_the_flags_give(no_environment):
    """A ServerConfig built by hand (tests, embedders) holds what the server gets with no flag."""
    config, _ = parse_config([])
    for f in dataclasses.fields(ServerConfig):
        if f.name in ("engine", "hosts"):  # engine: no default; hosts: [] stands for [host]
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert getattr(config, f.name) == default, f.name


def test_a_value_given_to_a_flag_arrives_in_the_field_it_sets(tmp_path, no_environment):
    """Each row with `sets`: a value other than its default, given on the command line, is the
    value of that field (so each row names the right field)."""
    for flag in FLAGS:
        if flag.sets is None:
            continue
        name = flag.names[-1]
        if flag.kind is bool or flag.kind in (ON, OFF):
            argv, expected = [name], True if flag.kind is bool else flag.kind
        elif flag.choices:
            expected = next(c for c in flag.choices if c != flag.default)
            argv = [name, expected]
        elif flag.kind in (SIZE, VRAM):
            argv, expected = [name, "3MiB"], 3 << 20
        elif flag.kind in (int, float):
            expected = flag.kind(flag.default + 1 if flag.kind is int else (flag.default / 2 or 0.5))
            argv = [name, str(expected)]
        else:  # a path or a name: a folder passes the checks of every one
            argv, expected = [name, str(tmp_path)], str(tmp_path)
        config, _ = parse_config(argv)
        obj, field = _field(config, flag.sets)
        assert getattr(obj, field) == expected, (argv, flag.sets)


# -- sizes --------------------------------------------------------------------------------


def test_a_bare_size_is_mib_as_in_llama_server():
    assert parse_size("8192") == 8 * GiB
    assert parse_size("0") == 0
    assert parse_size("8GiB") == 8 * GiB and parse_size("512MiB") == 512 * MiB and parse_size("2G") == 2 * GiB
    assert parse_size("4096B") == 4096 and parse_size("1.5k") == 1536


def test_size_flags_read_mib_and_auto_is_marked():
    config, _ = parse_config(["--cache-ram", "8192", "--checkpoint-ram", "512", "--cache-vram", "1024"])
    assert config.engine.cache_ram == 8 * GiB
    assert config.engine.checkpoint_bytes == 512 * MiB
    assert config.engine.cache_vram == GiB
    assert not config.engine.cache_ram_auto
    auto, _ = parse_config([])
    assert isinstance(parse_size("auto"), AutoSize) and auto.engine.cache_ram_auto
    assert auto.engine.cache_ram >= GiB


def test_help_says_sizes_are_mib():
    text = build_parser().format_help()
    assert "a bare number is MiB" in text and "8192: 8 GiB" in text


# -- sampling defaults and other flags ------------------------------------------------------


def test_sampling_flags_are_the_request_defaults():
    config, _ = parse_config([
        "--temp", "0.3", "--top-k", "7", "--top-p", "0.5", "--min-p", "0.1", "--repeat-penalty", "1.2",
        "--presence-penalty", "0.4", "--frequency-penalty", "0.6", "-s", "42",
    ])
    s = config.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty) == (0.3, 7, 0.5, 0.1, 1.2)
    assert (s.presence_penalty, s.frequency_penalty, s.seed) == (0.4, 0.6, 42)
    request = parse_generation({"messages": []}, 1000, config.sampling).sampling
    assert (request.temperature, request.top_k, request.seed) == (0.3, 7, 42)
    overridden = parse_generation({"temperature": 0.9, "seed": 1}, 1000, config.sampling).sampling
    assert (overridden.temperature, overridden.seed, overridden.top_k) == (0.9, 1, 7)
    assert parse_config([])[0].sampling.seed is None  # -1: a random seed per request


def test_flags_that_change_nothing_are_accepted_and_named():
    config, _ = parse_config(["--jinja", "--metrics", "--slots", "-cb"])
    assert [flag for flag, _ in config.ignored_flags] == ["--jinja", "--metrics", "--slots", "--cont-batching"]
    assert all(reason for _, reason in config.ignored_flags)
    assert parse_config([])[0].ignored_flags == []


def test_every_llama_server_flag_is_handled(capsys):
    """Each flag of the catalog parses: ignored ones are named with their reason, refused ones
    stop with a message naming the flag and the reason, aliases reach warmslot's flag."""
    from warmslot.server.process.llama_flags import FLAGS

    values = {"-": [], "1": ["1"], "?": [], "2": ["1", "2"]}
    actions = build_parser()._option_string_actions
    for flag in FLAGS:
        for name in flag.names:
            argv = [name, *values[flag.arity]]
            if flag.action == "refuse":
                with pytest.raises(SystemExit):
                    parse_config(argv)
                err = capsys.readouterr().err
                assert f"{flag.names[-1]} is not supported: {flag.reason}" in err, name
            elif flag.action == "ignore":
                config, _ = parse_config(argv)
                assert (flag.names[-1], flag.reason) in config.ignored_flags, name
            else:  # the alias's action is warmslot's own flag's
                target = flag.reason.split()[0]
                assert actions[name].dest == actions[target].dest, name


def test_every_flag_of_llama_server_at_this_commit_is_known():
    """llama-server's flags, read from common/arg.cpp of the llama.cpp that the pinned
    llama-cpp-python vendors: each one is warmslot's, or in the catalog."""
    import re

    from tests.server_suite import suite_root

    source = (suite_root() / "common" / "arg.cpp").read_text()
    flags = set()
    for chunk in source.split("add_opt(common_arg(")[1:]:
        names = re.match(r"\s*\{([^}]*)\}", chunk)
        body = chunk.split("add_opt(", 1)[0]
        examples, excludes = re.search(r"set_examples\(\{([^}]*)\}\)", body), re.search(r"set_excludes\(\{([^}]*)\}\)", body)
        if names and not (examples and "LLAMA_EXAMPLE_SERVER" not in examples.group(1)) and not (excludes and "LLAMA_EXAMPLE_SERVER" in excludes.group(1)):
            flags.update(re.findall(r'"(-[^"]+)"', names.group(1)))
    known = set(build_parser()._option_string_actions)
    assert len(flags) > 300 and "--sleep-idle-seconds" in flags
    assert sorted(flags - known) == []


def test_llama_server_spellings_reach_warmslot_flags():
    config, _ = parse_config(["--predict", "7", "--log-disable", "-fit", "off", "--no-ui", "--embedding", "--spec-draft-n-max", "5"])
    assert (config.n_predict, config.log_level, config.engine.fit, config.webui, config.engine.embeddings) == (7, "error", False, False, True)
    assert config.engine.spec.n_max == 5
    # no prefix matching: --reasoning is its own flag, never "ambiguous"
    assert parse_config(["--reasoning", "off"])[0].reasoning_default == "off"
    with pytest.raises(SystemExit):
        parse_config(["--reason", "off"])


def test_api_key_file_and_several_hosts(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nkey-one\n\n  key-two  \n")
    config, _ = parse_config(["--api-key", "k0", "--api-key-file", str(keys), "--host", "127.0.0.1,::1", "--tags", "a, b"])
    assert config.api_keys == ["k0", "key-one", "key-two"]
    assert (config.host, config.hosts, config.tags) == ("127.0.0.1", ["127.0.0.1", "::1"], ["a", "b"])


def test_model_flags(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    config, _ = parse_config(["-a", "agent-model, other", "--no-mmap", "--mlock", "-v",
                              "--chat-template-file", str(template), "--reasoning-format", "deepseek",
                              "--reasoning-budget", "0", "-hf", "org/repo:Q8_0", "-hff", "x.gguf"])
    assert config.alias == "agent-model" and config.aliases == ["agent-model", "other"]
    assert not config.engine.use_mmap and config.engine.use_mlock
    assert config.log_level == "debug"
    assert config.chat_template == str(template)
    assert (config.reasoning_format, config.reasoning_budget) == ("deepseek", 0)
    assert (config.hf_repo, config.hf_file) == ("org/repo:Q8_0", "x.gguf")


@pytest.mark.parametrize("argv", [
    ["--chat-template-file", "/no/such/file.jinja"],
    ["-m", "model.gguf", "-hf", "org/repo"],
    ["--reasoning-budget", "-2"],
    ["--reasoning-format", "deepseek-legacy"],
])
def test_bad_flags_are_refused(argv):
    with pytest.raises(SystemExit) as info:
        parse_config(argv)
    assert info.value.code == 2


# -- the context-overflow error, as clients classify it ---------------------------------------


def test_context_overflow_keeps_its_fields_and_llama_servers_words():
    body = ContextOverflow(40000, 32768).body()["error"]
    assert "exceeds the available context size" in body["message"]
    assert (body["n_prompt_tokens"], body["n_ctx"], body["code"]) == (40000, 32768, "exceed_context_size_error")


def test_litellm_maps_it_to_context_window_exceeded():
    """litellm's own rule (litellm_core_utils/exception_mapping_utils.py), run on the body the
    openai client puts in the exception text."""
    from litellm.litellm_core_utils.exception_mapping_utils import ExceptionCheckers

    error = ContextOverflow(5009, 4096).body()
    assert ExceptionCheckers.is_error_str_context_window_exceeded(f"Error code: 400 - {error}")


# hermes-agent 0.19.0, agent/error_classifier.py: a 400 is a context overflow when its
# lowercased text matches _CONTEXT_OVERFLOW_PATTERNS and none of the checks before it
# (content policy, multimodal tool content, image size, request validation, empty response).
HERMES_EARLIER = [
    "flagged for possible cybersecurity risk", "trusted access for cyber", "violates our usage policies",
    "violates openai's usage policies", "your request was flagged by", "prompt was flagged by our safety",
    "responses cannot be generated due to safety", "content_filter", "responsibleaipolicyviolation",
    "new_sensitive", "text is not set", "tool message content must be a string", "tool content must be a string",
    "tool message must be a string", "expected string, got list", "expected string, got array",
    "tool_call.content must be string", "image exceeds", "image too large", "image_too_large",
    "image size exceeds", "image dimensions exceed", "dimensions exceed max allowed size",
    "max allowed size: 8000", "unknown parameter", "unsupported parameter", "unrecognized request argument",
    "unknown_parameter", "unsupported_parameter", "returned an empty response", "empty response despite retries",
    "provider returned an empty response", "model returning empty responses", "empty response stream",
]
HERMES_OVERFLOW = [
    "context length", "context size", "maximum context", "token limit", "too many tokens", "reduce the length",
    "exceeds the limit", "context window", "prompt is too long", "prompt exceeds max length", "max_tokens",
    "maximum number of tokens", "exceeds the max_model_len", "max_model_len", "prompt length", "input is too long",
    "maximum model length", "context length exceeded", "truncating input", "slot context", "n_ctx_slot",
]
# agent/model_metadata.py: parse_context_limit_from_error, the patterns in their order
HERMES_LIMIT = [
    r"max_model_len\s*(?:is\s*)?[:=(]?\s*(\d{4,})",
    r"maximum model length\s*(?:is\s*)?[:=(]?\s*(\d{4,})",
    r"(?:max(?:imum)?|limit)\s*(?:context\s*)?(?:length|size|window)?\s*(?:is|of|:)?\s*(\d{4,})",
    r"context\s*(?:length|size|window)\s*(?:is|of|:)?\s*(\d{4,})",
    r"(\d{4,})\s*(?:token)?\s*(?:context|limit)",
    r">\s*(\d{4,})\s*(?:max|limit|token)",
    r"(\d{4,})\s*(?:max(?:imum)?)\b",
]


def hermes_classifies_400(message: str) -> str:
    text = message.lower()
    if any(p in text for p in HERMES_EARLIER):
        return "other"
    return "context_overflow" if any(p in text for p in HERMES_OVERFLOW) else "format_error"


def hermes_limit(message: str) -> int | None:
    for pattern in HERMES_LIMIT:
        match = re.search(pattern, message.lower())
        if match and 1024 <= int(match.group(1)) <= 10_000_000:
            return int(match.group(1))
    return None


def test_hermes_agent_compresses_and_learns_the_limit():
    error = ContextOverflow(40000, 32768)
    text = f"Error code: 400 - {error.body()}"  # what str(openai.BadRequestError) holds
    assert hermes_classifies_400(text) == "context_overflow"
    assert hermes_limit(error.message) == 32768
    old = "the request needs 40000 prompt tokens, but the context of a slot holds 32768 tokens"
    assert hermes_classifies_400(old) == "format_error"  # the wording that ended hermes-agent's runs


# -- the default context ------------------------------------------------------------------


def test_default_context_is_the_training_context_when_it_fits():
    fits = choose_context(0, 131072, 1000, 200 * 1000 * 1000, 4, "RAM")
    assert (fits.n_ctx, fits.source) == (131072, ContextSource.TRAINING)
    tight = choose_context(0, 131072, 1000, 50 * 1000 * 1000, 4, "RAM")
    assert tight.source is ContextSource.MEMORY
    assert tight.n_ctx * 1000 <= 50 * 1000 * 1000 and tight.n_ctx % (4 * 256) == 0
    assert tight.n_ctx > 50 * 1000 - 4 * 256
    assert "largest that fits" in tight.describe()
    assert choose_context(0, 131072, 1000, -5, 4, "RAM").n_ctx == 4 * 256  # never below a granule per slot
    assert choose_context(8192, 131072, 1000, 0, 4, "RAM").source is ContextSource.FLAG
    unknown = choose_context(0, 131072, None, 10**12, 4, "RAM")
    assert (unknown.n_ctx, unknown.source) == (32768, ContextSource.FALLBACK)


def test_buffers_are_summed_per_device():
    records = [("model", "CPU_Mapped", 100), ("model", "CPU_REPACK", 10), ("model", "CUDA0", 1000),
               ("KV", "CUDA0", 7), ("KV", "CUDA0", 3), ("compute", "CUDA0", 50), ("compute", "CUDA0", 60),
               ("model", "CUDA_Host", 5)]
    assert buffers_by_device(records, "model") == {"CPU": 115, "CUDA0": 1000}
    assert buffers_by_device(records, "KV") == {"CUDA0": 10}
    assert buffers_by_device(records, "compute") == {"CUDA0": 60}  # reserved again: the last size
    assert buffers_by_device(records, "RS") == {}


# -- the reasoning budget -------------------------------------------------------------------


def run_budget(spec: ReasoningBudget, model_tokens: list[int]) -> list[int]:
    """The tokens a request ends with when the model would write `model_tokens`."""
    state, out, pending = BudgetState(spec), [], list(model_tokens)
    while pending or state.forced_token() is not None:
        forced = state.forced_token()
        token = forced if forced is not None else pending.pop(0)
        state.accept(token)
        out.append(token)
    return out


def test_reasoning_budget_forces_the_end_tag():
    spec = ReasoningBudget(start=(1,), end=(2, 3), forced=(2, 3), budget=3)
    assert run_budget(spec, [1, 7, 7, 7, 7, 7]) == [1, 7, 7, 7, 2, 3, 7, 7]
    assert run_budget(spec, [1, 7, 2, 3, 9]) == [1, 7, 2, 3, 9]  # a natural end within the budget
    assert run_budget(ReasoningBudget((1,), (2,), (2,), 0), [1, 7]) == [1, 2, 7]  # 0: end at once
    inside = ReasoningBudget((1,), (2,), (2,), 2, inside=True)
    assert run_budget(inside, [7, 7, 7]) == [7, 7, 2, 7]
    again = run_budget(ReasoningBudget((1,), (2,), (2,), 1), [1, 7, 7, 1, 7, 7])
    assert again == [1, 7, 2, 7, 1, 7, 2, 7]  # a new block, a new budget
    state = BudgetState(spec)
    state.accept(5)
    assert state.phase is Phase.IDLE and state.forced_token() is None


# -- the Hub file choice ------------------------------------------------------------------


def test_hub_file_choice_follows_llama_server():
    files = ["README.md", "model-Q8_0.gguf", "model-Q4_K_M.gguf", "mmproj-model-Q4_K_M.gguf", "model-q4_k_s.gguf"]
    assert choose_file(files, None) == "model-Q4_K_M.gguf"
    assert choose_file(files, "q8_0") == "model-Q8_0.gguf"
    assert choose_file(files, "Q4_K_S") == "model-q4_k_s.gguf"
    assert choose_file(["b-F16.gguf", "a-Q8_0.gguf"], None) == "a-Q8_0.gguf"  # no Q4_K_M: the first
    with pytest.raises(HubError, match="Q2_K"):
        choose_file(files, "Q2_K")
    with pytest.raises(HubError):
        choose_file(["README.md"], None)
    split = ["m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf"]
    assert choose_file(split, None) == "m-Q4_K_M-00001-of-00002.gguf"
    assert split_parts("m-Q4_K_M-00001-of-00002.gguf") == sorted(split)
    assert HubModel.parse("org/repo:Q8_0") == HubModel("org/repo", "Q8_0")
    with pytest.raises(HubError):
        HubModel.parse("just-a-name")


# -- tool calls cut by max_tokens --------------------------------------------------------------


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "',
    '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    'Let me check.\n<tool_',
])
def test_a_cut_tool_call_leaves_no_markup(text):
    parser = OutputParser("hermes", tools=[])
    parsed = parser.parse_complete(text, truncated=True)
    assert parser.cut
    assert "<tool" not in (parsed.content or "") and "{" not in (parsed.content or "")
    streamed = OutputParser("hermes", tools=[])
    events = [e for piece in text for e in streamed.feed(piece)] + streamed.finish(truncated=True)
    assert streamed.cut and not any("<tool" in getattr(e, "text", "") for e in events)


def test_an_output_cut_after_a_whole_call_is_not_cut():
    parser = OutputParser("hermes", tools=[])
    parsed = parser.parse_complete('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', truncated=True)
    assert not parser.cut and len(parsed.tool_calls) == 1
    plain = OutputParser("hermes", tools=[])
    assert plain.parse_complete("Just words", truncated=True).content == "Just words" and not plain.cut


def test_deepseek_and_none_reasoning_formats():
    from warmslot.server.request.reasoning import reasoning_mode

    thinking = "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n<think>\\n' -}}{%- endif -%}"
    assert reasoning_mode("auto", thinking) == (True, True)
    assert reasoning_mode("none", thinking) == (False, False)
    assert reasoning_mode("deepseek", "{{ messages }}") == (True, False)  # always split
    assert reasoning_mode("auto", "{{ messages }}") == (False, False)
