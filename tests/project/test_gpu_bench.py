"""The benchmark harness's pure pieces: variants, summaries, counters, the profile summariser,
the report sections and the plot, on made-up results and a py-spy profile recorded from warmslot."""

import json
import pathlib
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from scripts.gpu_bench import LLAMA_SERVER, WARMSLOT
from scripts.gpu_bench.cli import parse_args
from scripts.gpu_bench.plot import nice_ticks, svg_chart
from scripts.gpu_bench.profiling import parse_collapsed, summarise_profile
from scripts.gpu_bench.report_multiagent import copies_line, multiagent_section
from scripts.gpu_bench.report_throughput import plot_throughput, throughput_section
from scripts.gpu_bench.servers import Run, counters_delta, state_counters
from scripts.gpu_bench.workload_multiagent import arithmetic_line, multiagent_ctx, summarise_agents, unique_tokens
from scripts.gpu_bench.workload_throughput import Variant, VariantError, parse_variants, run_variants, summarise_requests

PROFILE = pathlib.Path(__file__).parents[1] / "data" / "pyspy-raw-warmslot.txt"


def test_variants_parse_into_server_and_flags():
    got = parse_variants("warmslot:--cache-ram 0; llama-server:-kvu ;llama-server:--cache-ram 0;")
    assert got == [Variant(WARMSLOT, ("--cache-ram", "0")), Variant(LLAMA_SERVER, ("-kvu",)),
                   Variant(LLAMA_SERVER, ("--cache-ram", "0"))]
    assert [v.label for v in got] == ["warmslot --cache-ram 0", "llama-server -kvu", "llama-server --cache-ram 0"]
    assert parse_variants("") == []
    assert parse_variants("warmslot:--warmslot-args 'a b'")[0].flags == ("--warmslot-args", "a b")


@pytest.mark.parametrize("text", ["warmslot", "vllm:--x", "warmslot:'unclosed"])
def test_bad_variants_are_refused(text):
    with pytest.raises(VariantError):
        parse_variants(text)


def test_each_server_default_runs_first_and_labels_are_unique():
    extra = parse_variants("warmslot:--cache-ram 0;warmslot:;warmslot:--cache-ram 0")
    labels = [v.label for v in run_variants([LLAMA_SERVER, WARMSLOT], extra)]
    assert labels == ["llama-server", "warmslot", "warmslot --cache-ram 0"]


def test_command_line_of_the_new_workloads():
    a = parse_args(["-m", "x.gguf", "--out", "o.json", "--workloads", "throughput,multiagent", "--tp-np", "1,4",
                    "--tp-variants", "llama-server:-kvu"])
    assert a.workloads == ["throughput", "multiagent"] and a.tp_np == [1, 4]
    assert a.tp_variants == [Variant(LLAMA_SERVER, ("-kvu",))]
    assert not a.llama_server_kvu  # llama-server's own default unless asked
    assert (a.tp_clients, a.tp_requests, a.ma_agents, a.ma_np, a.ma_turns) == (32, 96, 8, 4, 6)
    with pytest.raises(SystemExit):
        parse_args(["-m", "x.gguf", "--out", "o.json", "--tp-variants", "nope:-x"])


def test_placement_flags_go_to_both_servers():
    """A split run gives both servers the same -sm/-ts/-dev/--rpc, and a plain run none."""
    a = parse_args(["-m", "x.gguf", "--out", "o.json", "-sm", "layer", "-ts", "1,1", "-dev", "CUDA0,CUDA1",
                    "--rpc", "127.0.0.1:50052", "--llama-server", "/bin/true"])
    run = Run(a)
    placement = ["-sm", "layer", "-ts", "1,1", "-dev", "CUDA0,CUDA1", "--rpc", "127.0.0.1:50052"]
    for server in (WARMSLOT, LLAMA_SERVER):
        flags = run.flags(server, 1, 4096)
        start = flags.index("-sm")
        assert flags[start:start + len(placement)] == placement
    plain = Run(parse_args(["-m", "x.gguf", "--out", "o.json"]))
    assert not {"-sm", "-ts", "-mg", "-dev", "--rpc"} & set(plain.flags(WARMSLOT, 1, 4096))
    with pytest.raises(SystemExit):
        parse_args(["-m", "x.gguf", "--out", "o.json", "-sm", "rows"])


def row(start, end, tokens, ttft, ok=True, **kw):
    return {"ok": ok, "t_start_s": start, "t_end_s": end, "total_s": end - start, "ttft_s": ttft,
            "completion_tokens": tokens, "prompt_tokens": 100, **kw}


def test_throughput_counts_every_token_over_first_send_to_last_end():
    rows = [row(0.0, 2.0, 10, 0.5), row(0.5, 4.0, 10, 1.5), row(1.0, 3.0, 10, 1.0),
            {"ok": False, "error": "boom"}]
    s = summarise_requests(rows)
    assert (s["requests"], s["ok"], s["completion_tokens"]) == (4, 3, 30)
    assert s["span_s"] == 4.0 and s["tokens_per_s"] == 7.5
    assert s["ttft_s_p50"] == 1.0 and s["errors"] == ["boom"]
    assert summarise_requests([])["tokens_per_s"] is None


def test_multiagent_summary_and_context():
    rows = [row(0.0, 1.0, 4, 0.2, computed_tokens=900, cached_tokens=0),
            row(0.1, 2.5, 4, 0.4, computed_tokens=150, cached_tokens=850)]
    s = summarise_agents(rows)
    assert s["computed_tokens_total"] == 1050 and s["cached_tokens_total"] == 850
    assert s["wall_s"] == 2.5 and s["latency_s_p50"] == pytest.approx(1.7)
    a = SimpleNamespace(ma_ctx_size=0, ma_system_tokens=2800, ma_turns=6, ma_tool_tokens=530, ma_gen_tokens=32,
                        ma_np=4)
    assert multiagent_ctx(a, tools_tokens=1200) == 32768
    assert multiagent_ctx(a, tools_tokens=5000) > 32768  # tools bigger than the asked size
    assert multiagent_ctx(SimpleNamespace(**{**vars(a), "ma_ctx_size": 4096}), 0) == 4096


def test_multiagent_unique_tokens_count_each_conversation_and_the_shared_prefix_once():
    def turn(agent, n, prompt, ok=True, computed=None):
        return {"agent": agent, "turn": n, "ok": ok, "prompt_tokens": prompt, "computed_tokens": computed,
                "t_start_s": 0.0, "t_end_s": 1.0, "total_s": 1.0}

    rows = [turn(0, 1, 1000, computed=1000), turn(0, 2, 1600, computed=600),
            turn(1, 1, 1010, computed=210), turn(1, 2, 1700, computed=1700),  # agent 1 computed its prompt again
            turn(2, 1, None, ok=False)]  # agent 2 never answered: neither its conversation nor a prefix counts
    assert unique_tokens(rows, 800) == 1600 + 1700 - 800
    assert unique_tokens(rows, None) is None and unique_tokens([], 800) == 0
    assert unique_tokens(rows[:2], 800) == 1600  # one agent: nothing shared to take away
    counters = {"warmslot_state_copy_bytes_total{cause=park}": 3.5e6,
                "warmslot_state_copy_bytes_total{cause=load}": 3.5e6}
    s = summarise_agents(rows, 800, counters, kv_bytes_per_token=1000)
    assert (s["shared_prefix_tokens"], s["unique_tokens"], s["computed_tokens_total"]) == (800, 2500, 3510)
    assert s["computed_over_ideal"] == 1.404 and s["unique_kv_bytes"] == 2_500_000
    assert s["state_copy_bytes"]["by_direction"] == {"to_device": 3.5e6, "to_ram": 3.5e6}
    assert s["copy_bytes_over_computed_kv"] == round(7e6 / 3.51e6, 4)
    assert arithmetic_line(s) == ("computed 3510 vs ideal (unique tokens) 2500 (1.404x); copied 0.01 GB = "
                                  "1.9943x the KV bytes computed")
    assert s["checkpoint_bytes"] == 0 and s["copy_and_checkpoint_bytes_over_computed_kv"] == s["copy_bytes_over_computed_kv"]
    # the partial states of hybrid memory cross the bus too: counted apart, then with the copies
    counters["warmslot_checkpoint_saved_bytes_total"] = 2e6
    counters["warmslot_checkpoint_restored_bytes_total"] = 0.5e6
    s = summarise_agents(rows, 800, counters, kv_bytes_per_token=1000)
    assert s["checkpoint_bytes"] == 2.5e6 and s["copy_and_checkpoint_bytes_over_computed_kv"] == round(9.5e6 / 3.51e6, 4)
    assert arithmetic_line(s).endswith("the KV bytes computed, and 0.00 GB of checkpoints saved and restored "
                                       "(2.7066x with them)")
    assert copies_line({"warmslot": {"summary": s}}).endswith("Checkpoints saved and restored: 0.00 GB more (2.707x with the copies).")
    assert "state_copy_bytes" not in summarise_agents(rows, 800)  # llama-server: no copy counters


def test_state_counters_keep_bytes_seconds_and_sources():
    metrics = {"warmslot_prompt_cache_saved_bytes_total": 10.0, "warmslot_checkpoint_save_seconds_total": 0.5,
               "warmslot_prompt_tokens_total{source=ram}": 7.0, "warmslot_slots_parked_total": 1.0,
               "warmslot_prompt_cache_bytes": 99.0, "warmslot_queue_depth": 3.0,
               "warmslot_time_to_first_token_seconds_sum": 1.0, "llamacpp:prompt_tokens_total": 5.0}
    kept = state_counters(metrics)
    assert set(kept) == {"warmslot_prompt_cache_saved_bytes_total", "warmslot_checkpoint_save_seconds_total",
                         "warmslot_prompt_tokens_total{source=ram}", "warmslot_slots_parked_total",
                         "llamacpp:prompt_tokens_total"}
    assert counters_delta({"a": 1.0}, {"a": 3.0, "b": 2.0}) == {"a": 2.0, "b": 2.0}


def test_profile_of_the_engine_thread():
    stacks = parse_collapsed(PROFILE.read_text())
    assert {thread for thread, _, _ in stacks} >= {"warmslot-engine", "MainThread", "16325"}
    s = summarise_profile(PROFILE.read_text())
    assert s["thread"] == "warmslot-engine" and s["samples"] == s["threads"]["warmslot-engine"] > 0
    top = s["self"][0]
    assert top["function"] == "Context.decode (slots/llama_api.py)"  # line numbers are dropped
    assert sum(e["samples"] for e in s["self"]) == s["samples"]
    assert s["cumulative"][0]["share"] == 1.0  # the thread's entry frame is on every stack


def test_profile_summary_counts_a_function_once_per_sample():
    text = ("thread (1): warmslot-engine;run (e.py:1);step (e.py:2);step (e.py:9);decode (l.py:3) 6\n"
            "thread (1): warmslot-engine;run (e.py:1);wait (t.py:5) 2\n"
            "thread (2): other;x (o.py:1) 9\n"
            "garbage line\n")
    s = summarise_profile(text)
    assert s["samples"] == 8 and s["threads"] == {"other": 9, "warmslot-engine": 8}
    assert {e["function"]: e["samples"] for e in s["cumulative"]}["step (e.py)"] == 6
    assert [(e["function"], e["share"]) for e in s["self"]] == [("decode (l.py)", 0.75), ("wait (t.py)", 0.25)]


def throughput_result():
    def run(np_, tps, profiled=False):
        r = {"np": np_, "summary": {"ok": 4, "requests": 4, "tokens_per_s": tps, "ttft_s_p50": 0.1,
                                    "ttft_s_p95": 0.2, "latency_s_p50": 1.0},
             "counters_delta": {"warmslot_prompt_cache_saved_bytes_total": 2e6, "warmslot_slots_parked_total": 0.0}}
        if profiled:
            r["profiled"] = True
            r["profile"] = {"file": "/x/run-throughput-np4-warmslot.pyspy.txt",
                            "summary": summarise_profile(PROFILE.read_text())}
        return r
    return {"settings": {"clients": 4, "requests": 4, "prompt_tokens": 40, "gen_tokens": 8, "ctx": 4096},
            "servers": {LLAMA_SERVER: {"name": LLAMA_SERVER, "runs": {"1": run(1, 100.0), "4": run(4, 300.0)}},
                        WARMSLOT: {"name": WARMSLOT, "runs": {"1": run(1, 110.0), "4": run(4, 240.0, True)}},
                        "warmslot --cache-ram 0": {"name": WARMSLOT, "runs": {"1": run(1, 90.0),
                                                                                 "4": {"np": 4, "skipped": "time"}}}}}


def test_throughput_report_ratios_counters_and_profile():
    text = throughput_section(throughput_result())
    assert "| 4 | warmslot (profiled) | 4/4 | 240 | 0.80x |" in text
    assert "| 1 | warmslot --cache-ram 0 | 4/4 | 90 | 0.90x |" in text
    assert "| 4 | warmslot --cache-ram 0 | time |" in text
    assert "`warmslot_prompt_cache_saved_bytes_total` | 2.0 MB" in text
    assert "warmslot_slots_parked_total" not in text  # never moved
    assert "`Context.decode (slots/llama_api.py)`" in text and "warmslot at -np 4" in text


def test_throughput_plot_is_drawn(tmp_path):
    path = plot_throughput(throughput_result(), tmp_path / "m-throughput", "m")
    assert path is not None and path.stat().st_size > 0 and path.suffix in (".png", ".svg")


def test_svg_chart_is_valid_svg(tmp_path):
    path = svg_chart({"a": [(1, 10.0), (4, 35.5), (16, 80.0)], "b & c": [(1, 12.0), (16, 40.0)]},
                     tmp_path / "c.svg", "title <x>", "-np", "tok/s")
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    texts = [t.text for t in root.iter() if t.tag.endswith("text")]
    assert "title <x>" in texts and "b & c" in texts and "16" in texts
    assert nice_ticks(80.0) == [0, 20, 40, 60, 80] and nice_ticks(0) == [0.0, 1.0]


def test_multiagent_report_ratios():
    def server(computed, wall):
        return {"summary": {"ok": 4, "requests": 4, "computed_tokens_total": computed, "wall_s": wall,
                            "latency_s_p50": wall / 4, "ttft_s_p50": 0.1, "unique_tokens": 2000,
                            "computed_over_ideal": computed / 2000},
                "counters_delta": {"warmslot_prompt_cache_loaded_bytes_total": 5e6}}
    w = {"settings": {"agents": 2, "np": 2, "turns": 2}, "servers": {LLAMA_SERVER: server(4000, 10.0),
                                                                      WARMSLOT: server(1000, 5.0)}}
    assert "warmslot's state copies" not in multiagent_section(w)
    w["servers"][WARMSLOT]["summary"].update({"state_copy_bytes": {"total": 2.5e9}, "kv_bytes_per_token": 1000,
                                              "copy_bytes_over_computed_kv": 2.5})
    text = multiagent_section(w)
    assert "computed prompt tokens 0.25x, wall 0.50x, latency p50 0.50x, TTFT p50 1.00x" in text
    assert "| llama-server | 4/4 |" in text and "5.0 MB" in text
    assert "| unique tokens | computed / unique |" in text and "| 4,000 | 2,000 | 2 |" in text
    assert "| 1,000 | 2,000 | 0.500 |" in text
    assert "warmslot's state copies: 2.50 GB = 2.500x the KV bytes of the tokens it computed" in text
    json.dumps(w)  # plain data all along


def test_without_py_spy_the_run_notes_it_and_the_report_says_so(monkeypatch, tmp_path):
    import scripts.gpu_bench.profiling as profiling

    monkeypatch.setattr(profiling, "find_py_spy", lambda *interpreters: None)
    profiler, note = profiling.record_profile(123, 5, 100, tmp_path / "p.txt", "/venv/bin/python")
    assert profiler is None and "py-spy is not on PATH" in note["skipped"]
    w = throughput_result()
    w["servers"][WARMSLOT]["runs"]["4"]["profile"] = note
    assert "No profile of warmslot at -np 4: py-spy is not on PATH" in throughput_section(w)


def test_disk_workload_arguments_and_window_rate(tmp_path):
    from scripts.gpu_bench.workload_disk import _rate_in_window, filesystem_of
    from scripts.page_cache import drop_page_cache

    a = parse_args(["-m", "x.gguf", "--out", "o.json", "--workloads", "disk", "--disk-tokens", "1500", "--spill-ram", "200KiB"])
    assert a.workloads == ["disk"] and (a.disk_tokens, a.spill_ram, a.spill_requests) == (1500, "200KiB", 8)
    # chunks at 0.1 s steps from t_start 10; the window [10.25, 10.75] holds 5 of them
    rec = {"t_start": 10.0, "chunk_times": [0.1 * i for i in range(1, 11)], "completion_tokens": 10}
    got = _rate_in_window(rec, 10.25, 10.75)
    assert got["tokens"] == 5 and got["tokens_per_s"] == pytest.approx(10.0)
    assert _rate_in_window(rec, 20.0, 21.0)["tokens_per_s"] is None
    (tmp_path / "a.wsc").write_bytes(b"x" * 5000)
    assert drop_page_cache(tmp_path) == 5000
    fs = filesystem_of(tmp_path)
    assert fs["mount"] and fs["free_bytes"] > 0


def test_messages_session_interleaves_agents_and_compacts_after_the_first_request():
    from scripts.gpu_bench.claude_code import CLEARED, Session, schedule
    from scripts.gpu_bench.text import TextFactory
    from scripts.gpu_bench.workload_messages import add_ideal, summarise

    a = parse_args(["-m", "x.gguf", "--out", "o.json", "--workloads", "messages", "--msg-np", "1,2",
                    "--msg-scale", "0.1"])
    assert a.workloads == ["messages"] and a.msg_np == [1, 2] and a.msg_scale == 0.1
    steps = schedule(4, 2)
    assert [s.agent for s in steps] == ["main", "sub1", "main", "sub2", "main", "sub1", "main", "sub2", "main",
                                        "main", "main"]
    assert [s.base for s in steps] == [None, None, 0, None, 2, 1, 4, 3, 6, 0, 9]
    assert [s.compacted for s in steps][-2:] == [True, True] and steps[-2].n_results == 4
    session = Session(TextFactory(), scale=0.02, gen_tokens=8, billing="version", session_id="s", shapes="legacy")
    b0, b1 = session.body(steps[0], 0), session.body(steps[2], 2)
    assert b0["system"][0]["text"].startswith("x-anthropic-billing-header: cc_version=2.1.0;")
    assert b0["system"][0] != b1["system"][0] and b0["system"][1] == b1["system"][1]  # only the header changes
    assert len(b0["tools"]) == 12 and all("input_schema" in t for t in b0["tools"])
    assert b1["messages"][1]["content"][1]["type"] == "tool_use"
    compacted = session.body(steps[-2], 9)["messages"]
    assert compacted[2]["content"][0]["content"] == CLEARED
    assert compacted[4] == session.body(steps[8], 8)["messages"][4]  # only the first result is rewritten
    # ideal: a whole prompt first, then what is past the base request's prompt
    rows = [{"agent": s.agent, "compacted": s.compacted, "base": s.base, "ok": True, "ttft_s": 0.1,
             "prompt_tokens": 100 + 10 * i, "cached_tokens": 0, "computed_tokens": 5} for i, s in enumerate(steps)]
    add_ideal(rows)
    assert [r["ideal_computed"] for r in rows][:3] == [100, 110, 20] and rows[-2]["ideal_computed"] == 90
    s = summarise(rows)
    assert s["ok"] == 11 and s["per_agent"]["sub1"]["requests"] == 2 and s["main_ttft_s_p50"] == 0.1


def test_messages_current_shapes_add_todays_fields_a_system_message_and_a_title_request():
    from scripts.gpu_bench.claude_code import Session
    from scripts.gpu_bench.claude_code_shapes import TITLE_SCHEMA, title_matches_schema
    from scripts.gpu_bench.text import TextFactory

    assert parse_args(["-m", "x.gguf", "--out", "o.json"]).msg_shapes == "current"
    session = Session(TextFactory(), scale=0.02, gen_tokens=8, billing="version", session_id="s")
    steps = session.schedule(2, 1)
    assert [s.agent for s in steps] == ["main", "title", "sub1", "main", "sub2", "main", "main", "main"]
    assert session.path() == "/v1/messages?beta=true"
    for i in (0, 2, 3):  # the main agent's and the sub-agents' requests
        body = session.body(steps[i], i)
        assert [m["role"] for m in body["messages"]][:2] == ["user", "system"]
        assert "Agent" in body["messages"][1]["content"][0]["text"] and "temperature" not in body
        assert body["thinking"] == {"type": "adaptive"} and body["output_config"] == {"effort": "medium"}
        assert body["context_management"]["edits"]
        assert "mid-conversation-system-2026-04-07" in session.headers(steps[i])["anthropic-beta"].split(",")
    assert session.body(steps[3], 3)["messages"][2]["content"][1]["type"] == "tool_use"  # after the system message
    title = session.body(steps[1], 1)
    assert title["tools"] == [] and title["thinking"] == {"type": "disabled"} and title["max_tokens"] <= 64
    assert title["output_config"]["format"] == {"type": "json_schema", "schema": TITLE_SCHEMA}
    assert [m["role"] for m in title["messages"]] == ["user"]
    assert title_matches_schema('{"title": "Config helper rename"}')
    assert not any(title_matches_schema(t) for t in ('{"title": 3}', '{"title": "a", "b": 1}', '["a"]', "Title", None))
    legacy = Session(TextFactory(), scale=0.02, gen_tokens=8, billing="version", session_id="s", shapes="legacy")
    assert [s.agent for s in legacy.schedule(2, 1)] == ["main", "sub1", "main", "sub2", "main", "main", "main"]
    assert "system" not in [m["role"] for m in legacy.body(steps[0], 0)["messages"]] and legacy.headers(steps[0]) == {}


def test_messages_summary_counts_errors_per_agent_and_skips_refused_bases():
    from scripts.gpu_bench.workload_messages import add_ideal, summarise

    def r(agent, base, ok, prompt=None, status=200, **kw):
        return {"agent": agent, "base": base, "compacted": False, "ok": ok, "status": status if ok else 500,
                "error": None if ok else "HTTP 500: mid-conversation system message", "ttft_s": 0.1 if ok else None,
                "prompt_tokens": prompt, "cached_tokens": 0 if ok else None, "computed_tokens": prompt, **kw}
    rows = [r("main", None, True, 100), r("title", None, True, 30, title_json_ok=True), r("main", 0, False),
            r("sub1", None, False), r("main", 2, True, 180)]
    add_ideal(rows)
    assert rows[-1]["ideal_computed"] == 80  # past the first request's prompt: the second was refused
    s = summarise(rows)
    assert s["errors_by_agent"] == {"main": 1, "title": 0, "sub1": 1}
    assert s["per_agent"]["main"]["statuses"] == [500] and "system" in s["per_agent"]["sub1"]["first_error"]
    assert s["title_json_ok"] is True and s["ok"] == 3


def codex_session(**kw):
    from scripts.gpu_bench.codex import CodexSession
    from scripts.gpu_bench.text import TextFactory

    return CodexSession(TextFactory(), scale=0.01, gen_tokens=8, **kw)


def test_codex_requests_are_the_clis_shapes_and_resend_the_whole_history():
    session = codex_session()
    head = session.head()
    assert [(i["type"], i["role"]) for i in head] == [("message", "developer")] * 2 + [("message", "user")] * 2
    body = session.body(head, 0)
    assert body["stream"] is True and body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    assert body["reasoning"] == {"summary": "auto"} and body["prompt_cache_key"] == session.session_id
    assert body["client_metadata"]["session_id"] == session.session_id and body["max_output_tokens"] == 8
    tools = body["tools"]
    namespace = next(t for t in tools if t["type"] == "namespace")
    assert namespace["name"] == "multi_agent_v1" and len(namespace["tools"]) == 5
    assert {"type": "web_search", "external_web_access": True} in tools
    assert {"exec_command", "apply_patch"} <= {t.get("name") for t in tools if t["type"] == "function"}
    flat = codex_session(tools_mode="functions").tools()
    assert {t["type"] for t in flat} == {"function"} and "spawn_agent" in {t["name"] for t in flat}
    # the output items come back as returned (reasoning with its blob), with an output per call
    output = [{"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}],
               "encrypted_content": "ws1.blob", "status": "completed"},
              {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "exec_command", "arguments": "{}",
               "status": "completed"}]
    items = session.turn_items(output, 0)
    assert [i["type"] for i in items] == ["reasoning", "function_call", "function_call_output"]
    assert items[0]["encrypted_content"] == "ws1.blob" and "status" not in items[0] and items[2]["call_id"] == "c1"
    # a reply without a call (or a refused request) gets the turn's scripted call: spawn_agent by namespace
    items = session.turn_items(None, 2)
    assert items[0]["name"] == "spawn_agent" and items[0]["namespace"] == "multi_agent_v1"
    assert items[1]["call_id"] == items[0]["call_id"] and len(items[1]["output"]) > 40
    assert "namespace" not in codex_session(tools_mode="functions").turn_items(None, 2)[0]


def test_codex_stream_is_timed_and_summarised(monkeypatch):
    import httpx

    from scripts.gpu_bench import workload_codex as wc

    events = [{"type": "response.created", "response": {}},
              {"type": "response.reasoning_text.delta", "delta": "hm"},
              {"type": "response.output_text.delta", "delta": "Hi"},
              {"type": "response.completed", "response": {
                  "status": "completed", "output": [{"type": "reasoning", "encrypted_content": "b"},
                                                    {"type": "message", "content": []}],
                  "usage": {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 100}, "output_tokens": 2}}}]
    sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
    replies = iter([(200, sse), (500, b'{"error": "boom"}')])

    def handle(request):
        status, content = next(replies)
        return httpx.Response(status, content=content)
    client = httpx.Client(transport=httpx.MockTransport(handle))
    monkeypatch.setattr(wc.httpx, "stream", lambda method, url, **kw: client.stream(method, url, **kw))
    first = wc.request_row(wc.stream_responses("http://x", {}, timeout=10))
    assert first["ok"] and not first["ttft_fallback"] and first["first_delta_s"] <= first["ttft_s"]
    assert (first["prompt_tokens"], first["cached_tokens"], first["computed_tokens"]) == (120, 100, 20)
    assert first["encrypted_content"] and first["output_types"] == ["reasoning", "message"]
    failed = wc.request_row(wc.stream_responses("http://x", {}, timeout=10))
    assert not failed["ok"] and failed["status"] == 500 and "boom" in failed["error"]
    rows = [{"turn": 0, **first}, {"turn": 1, **failed}, {"turn": 2, **first, "prompt_tokens": 150}]
    wc.add_ideal(rows)
    assert [r.get("ideal_computed") for r in rows] == [120, None, 30]
    s = wc.summarise(rows)
    assert (s["ok"], s["errors"], s["statuses"], s["encrypted_content_returned"]) == (2, 1, [500], 2)
    assert s["ttft_s_p50"] == first["ttft_s"] and s["computed_tokens_total"] == 40
    slower = {**s, "ttft_s_p50": s["ttft_s_p50"] * 2}
    cmp = wc.compare({"servers": {WARMSLOT: {"summary": s}, LLAMA_SERVER: {"summary": slower}}})
    assert cmp["ttft_ratio_warmslot_over_llama_server"] == 0.5 and cmp["errors"] == {WARMSLOT: 1, LLAMA_SERVER: 1}
    args = parse_args(["-m", "x.gguf", "--out", "o.json", "--workloads", "codex", "--codex-scale", "0.05"])
    assert args.workloads == ["codex"] and args.codex_scale == 0.05 and args.codex_tools == "codex"
