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
from scripts.gpu_bench.report_multiagent import multiagent_section
from scripts.gpu_bench.report_throughput import plot_throughput, throughput_section
from scripts.gpu_bench.servers import Run, counters_delta, state_counters
from scripts.gpu_bench.workload_multiagent import multiagent_ctx, summarise_agents
from scripts.gpu_bench.workload_throughput import Variant, VariantError, parse_variants, run_variants, summarise_requests

PROFILE = pathlib.Path(__file__).parent / "data" / "pyspy-raw-warmslot.txt"


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
                            "latency_s_p50": wall / 4, "ttft_s_p50": 0.1},
                "counters_delta": {"warmslot_prompt_cache_loaded_bytes_total": 5e6}}
    w = {"settings": {"agents": 2, "np": 2, "turns": 2}, "servers": {LLAMA_SERVER: server(4000, 10.0),
                                                                      WARMSLOT: server(1000, 5.0)}}
    text = multiagent_section(w)
    assert "computed prompt tokens 0.25x, wall 0.50x, latency p50 0.50x, TTFT p50 1.00x" in text
    assert "| llama-server | 4/4 |" in text and "5.0 MB" in text
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
    session = Session(TextFactory(), scale=0.02, gen_tokens=8, billing="version", session_id="s")
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
