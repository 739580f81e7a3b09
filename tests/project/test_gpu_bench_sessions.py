"""The `sessions` workload's pure pieces: what the sessions share and what is their own, the
schedule, the summary's ideal, TTFT and copy ratio, the comparison and the report section."""

import pytest

from scripts.gpu_bench import LLAMA_SERVER, WARMSLOT
from scripts.gpu_bench.claude_code_sessions import UserSession, chat_form, session_schedule
from scripts.gpu_bench.cli import parse_args
from scripts.gpu_bench.report_sessions import merge_sessions, sessions_section
from scripts.gpu_bench.text import TextFactory
from scripts.gpu_bench.workload_sessions import compare, copy_bytes, summarise


def test_runs_parse_and_bad_ones_are_refused():
    a = parse_args(["-m", "x.gguf", "--out", "o.json", "--workloads", "sessions"])
    assert a.workloads == ["sessions"] and a.sess_runs == [(4, 2), (16, 4)]
    assert (a.sess_requests, a.sess_gen_tokens, a.sess_billing, a.sess_shapes) == (15, 16, "cch", "current")
    assert parse_args(["-m", "x.gguf", "--out", "o.json", "--sess-runs", "3:2"]).sess_runs == [(3, 2)]
    for bad in ("4", "4:0", "a:b", "4:2,"):
        with pytest.raises(SystemExit):
            parse_args(["-m", "x.gguf", "--out", "o.json", "--sess-runs", bad])


def test_schedule_interleaves_a_background_sub_agent_with_the_main_agent():
    steps = session_schedule(15, title=True)
    assert [s.agent for s in steps] == ["main", "title", "main", "sub", "main", "sub", "main", "sub", "main", "sub",
                                        "main", "main", "main", "main", "main"]
    assert [s.n_results for s in steps if s.agent == "main"] == list(range(10))
    assert [s.base for s in steps][:6] == [None, None, 0, None, 2, 3]
    assert [s.agent for s in session_schedule(4, title=True)] == ["main", "title", "main", "sub"]
    assert [s.agent for s in session_schedule(4, title=False)] == ["main", "sub", "main", "main"]


def test_sessions_share_the_system_prompt_and_tools_and_nothing_past_the_task():
    texts = TextFactory()
    one, two = (UserSession(texts, i, scale=0.02, gen_tokens=8, billing="cch", shapes="current") for i in (0, 1))
    steps = session_schedule(15, title=True)
    for i in (0, 3):  # the main agent's and the sub-agent's first requests
        a, b = one.body(steps[i], one.billing_index(i)), two.body(steps[i], two.billing_index(i))
        assert a["system"][1:] == b["system"][1:] and a["tools"] == b["tools"]  # the shared prefix
        assert a["system"][0] != b["system"][0]  # the billing header's cch
        assert a["messages"][0] != b["messages"][0]  # each session's own task
        assert chat_form(a)[0][0] == chat_form(b)[0][0] and chat_form(a)[0][1] != chat_form(b)[0][1]
    assert one.body(steps[14], 14)["messages"][3] != two.body(steps[14], 14)["messages"][3]  # own tool results
    main = UserSession(texts, 0, scale=1, gen_tokens=8, billing="cch", shapes="current").agents["main"]
    sizes = [main.result_tokens(k) for k in range(9)]
    assert all(2000 <= n <= 9000 for k, n in enumerate(sizes) if k in (1, 2, 5, 6, 8))  # files, searches, logs
    assert all(60 <= n <= 400 for k, n in enumerate(sizes) if k in (0, 3, 4, 7))  # edits, todos, the summary
    assert chat_form(one.body(steps[1], 1))[1] is None  # the title request has no tools


def r(session, agent, base, prompt, computed, ttft, new=None, start=0.0, end=1.0, ok=True):
    return {"session": session, "index": 0, "agent": agent, "base": base, "ok": ok, "error": None if ok else "boom",
            "prompt_tokens": prompt, "cached_tokens": prompt - computed, "computed_tokens": computed, "ttft_s": ttft,
            "new_tokens": prompt if new is None else new, "t_start_s": start, "t_end_s": end}


def test_summary_counts_the_shared_prefix_once_and_times_small_main_requests():
    rows = [r(0, "main", None, 1000, 1000, 0.9, start=0.5), r(1, "main", None, 1010, 300, 0.5),
            r(0, "main", 0, 1200, 200, 0.2, new=200), r(1, "main", 0, 1900, 890, 0.8, new=890, end=4.0),
            r(1, "sub", None, 500, 500, 0.3), r(0, "main", 0, 0, 0, None, ok=False)]
    counters = {"warmslot_state_copy_bytes_total{cause=load}": 300.0,
                "warmslot_state_copy_bytes_total{cause=overwrite}": 600.0,
                "warmslot_state_copy_seconds_total{cause=load}": 0.1}
    s = summarise(rows, {"main": 700, "sub": None}, counters, kv_bytes_per_token=2)
    assert s["ideal_per_agent_total"] == 1000 + 1010 + 200 + 890 + 500
    assert s["ideal_computed_total"] == 3600 - 700 and s["ideal_shared_once"] is False  # sub's prefix unknown
    assert s["computed_tokens_total"] == 2890 and s["computed_over_ideal"] == round(2890 / 2900, 4)
    assert s["main_ttft_s_p50"] == 0.2 and s["main_ttft_n"] == 1  # only the request adding < 500 tokens
    assert s["wall_s"] == 4.0 and s["errors_by_agent"] == {"main": 1, "sub": 0}
    assert s["state_copy_bytes"]["by_direction"] == {"to_device": 300.0, "to_ram": 600.0}
    assert s["copy_bytes_over_computed_kv"] == round(900 / (2890 * 2), 4)
    assert summarise(rows, {}, {}, None).get("state_copy_bytes") is None  # llama-server: no copy counters
    assert copy_bytes({"warmslot_state_copy_bytes_total{cause=load,direction=to_ram}": 5.0})["by_direction"] == \
        {"to_device": 0.0, "to_ram": 5.0}


def test_comparison_and_report_give_the_ratios_per_run():
    def entry(wall, ttft, computed, copies=None):
        s = {"ok": 2, "requests": 2, "wall_s": wall, "main_ttft_s_p50": ttft, "main_ttft_n": 1,
             "computed_tokens_total": computed, "ideal_computed_total": 100, "computed_over_ideal": computed / 100}
        if copies is not None:
            s.update(state_copy_bytes={"total": copies}, copy_bytes_over_computed_kv=0.5)
        return {"summary": s, "counters": {"warmslot_state_copy_bytes_total{cause=load}": 1e6}}
    w = {"settings": {"runs": ["4:2"], "schedule": ["main:0"], "small_new_tokens": 500},
         "servers": {WARMSLOT: {"runs": {"4:2": entry(10.0, 0.2, 110, copies=2e9)}},
                     LLAMA_SERVER: {"runs": {"4:2": entry(20.0, 0.8, 300)}}}}
    w["comparison"] = c = compare(w)
    assert c["4:2"]["wall_ratio_warmslot_over_llama_server"] == 0.5
    assert c["4:2"]["ttft_ratio_warmslot_over_llama_server"] == 0.25
    assert c["4:2"]["computed_over_ideal"] == {WARMSLOT: 1.1, LLAMA_SERVER: 3.0}
    text = sessions_section(w)
    assert "| 4:2 | warmslot | 2/2 |" in text and "wall warmslot / llama-server 0.50x" in text and "2.00" in text


def test_runs_split_over_calls_merge_into_one_comparison():
    def res(wall):
        return {"summary": {"wall_s": wall}}
    first = {"settings": {"runs": ["4:2"]}, "servers": {WARMSLOT: {"runs": {"4:2": res(10.0)}},
                                                       LLAMA_SERVER: {"runs": {"4:2": res(20.0)}}}}
    warmslot_only = {"settings": {"runs": ["16:4"]}, "servers": {WARMSLOT: {"runs": {"16:4": res(30.0)}}}}
    later = {"settings": {"runs": ["16:4", "4:2"]},
             "servers": {LLAMA_SERVER: {"runs": {"16:4": res(90.0), "4:2": {"skipped": "time budget spent"}}}}}
    w = merge_sessions(merge_sessions(first, warmslot_only), later)
    assert w["settings"]["runs"] == ["16:4", "4:2"]
    assert w["comparison"]["16:4"]["wall_ratio_warmslot_over_llama_server"] == round(30 / 90, 4)
    assert w["comparison"]["4:2"]["wall_ratio_warmslot_over_llama_server"] == 0.5  # the skipped run does not win
