"""Inputs users can get from a production vLLM server: Prometheus scrapes (also gzipped),
the Prometheus HTTP API's query_range / query JSON, the Rust front end's stats line, and the
lines of open vLLM PRs (#42827's per-victim warning, #58037's reason label)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
import re

import pytest

from kvreplay import events as ev
from kvreplay.audit.record import audit_records
from kvreplay.parsers import parse_lines

CASE = str(Path(__file__).resolve().parents[2] / "data" / "logcases" / "p1_poisson_fcfs_200")
PROM = os.path.join(CASE, "metrics.prom.gz")
assert os.path.exists(PROM), "p1's scrapes missing from tests/data"


def _scrape_text() -> str:
    with gzip.open(PROM, "rt", encoding="utf-8") as f:
        return f.read()


def _samples(text: str):
    """(time, name, labels, value) of every sample line, read here by a plain regex (not by
    the code under test): `# SCRAPE t` sets the time of the lines after it."""
    t = None
    rx = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$')
    lab = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if line.startswith("# SCRAPE"):
            t = float(line.split()[2])
            continue
        if not line or line.startswith("#"):
            continue
        m = rx.match(line)
        assert m, line
        yield t, m.group(1), dict(lab.findall(m.group(2) or "")), m.group(3)


def _same(a: dict, b: dict) -> None:
    diff = {k: (a[k], b[k]) for k in a if k != "log" and a[k] != b[k]}
    assert not diff


def test_gzipped_scrapes_give_the_record_of_the_plain_file(tmp_path):
    plain = tmp_path / "metrics.prom"
    plain.write_text(_scrape_text())
    gz_rec, = audit_records(PROM)
    txt_rec, = audit_records(str(plain))
    _same(gz_rec, txt_rec)
    # vllm:num_preemptions_total went 0 -> 54 over the run (truth.json: 54 preemptions)
    assert gz_rec["preemptions_logged"] == 54
    assert gz_rec["source"] == "prometheus"


def test_query_range_json_gives_the_record_of_the_scrape_file(tmp_path):
    # what Prometheus' /api/v1/query_range returns for the vllm series it scraped: one
    # matrix per query; here one file per metric family, all of them
    series: dict[tuple, list] = {}
    for t, name, labels, value in _samples(_scrape_text()):
        key = (name, tuple(sorted(labels.items())))
        series.setdefault(key, []).append([t, value])
    by_family: dict[str, list] = {}
    for (name, labels), values in series.items():
        fam = re.sub(r"_(bucket|sum|count|total|created)$", "", name)
        metric = {"__name__": name, "instance": "10.0.0.7:8000", "job": "vllm", **dict(labels)}
        by_family.setdefault(fam, []).append({"metric": metric, "values": values})
    files = []
    for i, (fam, result) in enumerate(sorted(by_family.items())):
        p = tmp_path / f"q{i:03d}.json"
        p.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
        files.append(str(p))
    # many files as one input (a folder), and one big file
    folder_rec, = audit_records(str(tmp_path))
    scrape_rec, = audit_records(PROM)
    assert folder_rec["log"].endswith("instance=10.0.0.7:8000")
    _same(folder_rec, scrape_rec)
    one = tmp_path / "one" / "all.json"
    one.parent.mkdir()
    one.write_text(json.dumps({"status": "success", "data": {
        "resultType": "matrix", "result": [r for v in by_family.values() for r in v]}}))
    one_rec, = audit_records(str(one))
    _same(one_rec, scrape_rec)


def _query_range_files(folder) -> None:
    """p1's scrapes as /api/v1/query_range matrices, one file per metric family."""
    series: dict[tuple, list] = {}
    for t, name, labels, value in _samples(_scrape_text()):
        series.setdefault((name, tuple(sorted(labels.items()))), []).append([t, value])
    by_family: dict[str, list] = {}
    for (name, labels), values in series.items():
        fam = re.sub(r"_(bucket|sum|count|total|created)$", "", name)
        metric = {"__name__": name, "instance": "10.0.0.7:8000", "job": "vllm", **dict(labels)}
        by_family.setdefault(fam, []).append({"metric": metric, "values": values})
    folder.mkdir()
    for i, (fam, result) in enumerate(sorted(by_family.items())):
        (folder / f"q{i:03d}.json").write_text(json.dumps(
            {"status": "success", "data": {"resultType": "matrix", "result": result}}))


def test_query_range_json_joined_to_the_default_log_gives_its_record_and_evidence(tmp_path):
    # issue 30 must-show: the exported series give the same joined record as the scrape
    # file, and the same evidence (every counter, gauge and length histogram on the log's
    # clock) for the default log's answer, which is a function of it
    from kvreplay.audit import join, prom
    from kvreplay.sources import read_facts

    log = os.path.join(CASE, "server.default.log")
    _query_range_files(tmp_path / "export")
    api, = audit_records([log, str(tmp_path / "export")], replay=False)
    txt, = audit_records([log, PROM], replay=False)
    assert api["source"] == txt["source"] == "vllm log + prometheus"
    diff = {k: (api[k], txt[k]) for k in txt if k not in ("log", "metrics") and api[k] != txt[k]}
    assert not diff
    assert api["preemptions_logged"] == 54  # truth.json
    facts = read_facts([log], year=2026)
    a, how_a = join.scrapes_for_facts(facts, prom.read_scrapes(str(tmp_path / "export")))
    b, how_b = join.scrapes_for_facts(facts, prom.read_scrapes(PROM))
    assert how_a == how_b and len(a) == len(b) == 4
    assert a == b
    assert b[-1].preemptions == 54 and b[-1].prompt_len  # the counter and a histogram came through


def test_instant_query_files_one_per_scrape_time(tmp_path):
    by_time: dict[float, list] = {}
    for t, name, labels, value in _samples(_scrape_text()):
        by_time.setdefault(t, []).append({"metric": {"__name__": name, **labels}, "value": [t, value]})
    for i, (t, result) in enumerate(sorted(by_time.items())):
        (tmp_path / f"at{i}.json").write_text(json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": result}}))
    rec, = audit_records(str(tmp_path))
    _same(rec, audit_records(PROM)[0])


def test_two_instances_in_one_export_are_two_records(tmp_path):
    def series(inst, vals):
        return {"metric": {"__name__": "vllm:num_preemptions_total", "instance": inst, "engine": "0",
                           "model_name": "m"}, "values": [[100 + 15 * i, str(v)] for i, v in enumerate(vals)]}

    doc = {"status": "success", "data": {"resultType": "matrix", "result": [
        series("a:8000", [0, 3, 7]), series("b:8000", [10, 10, 12])]}}
    p = tmp_path / "export.json"
    p.write_text(json.dumps(doc))
    recs = audit_records(str(p))
    assert [r["log"].split("instance=")[1] for r in recs] == ["a:8000", "b:8000"]
    assert [r["preemptions_logged"] for r in recs] == [7, 2]


def test_prometheus_error_response_is_one_clear_line(tmp_path):
    from kvreplay.errors import UserError

    p = tmp_path / "bad.json"
    p.write_text('{"status":"error","errorType":"bad_data","error":"parse error at char 3"}')
    with pytest.raises(UserError, match="Prometheus returned an error: parse error"):
        audit_records(str(p))


def test_preemptions_by_reason_pr_58037(tmp_path):
    text = ""
    for t, (full, prio) in zip((100, 115), ((2, 0), (9, 4))):
        text += (f"# SCRAPE {t}\n"
                 f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {full + prio}.0\n'
                 f'vllm:num_preemptions_by_reason_total{{engine="0",model_name="m",reason="kv_full"}} {full}.0\n'
                 f'vllm:num_preemptions_by_reason_total{{engine="0",model_name="m",reason="priority"}} {prio}.0\n')
    from kvreplay.audit import prom

    p = tmp_path / "m.prom"
    p.write_text(text)
    sc = prom.read_scrapes(str(p))
    assert [s.values["0"]["preemptions_kv_full"] for s in sc] == [2.0, 9.0]
    assert [s.values["0"]["preemptions_priority"] for s in sc] == [0.0, 4.0]


# ------------------------------------------------------------------ Rust front end
# The sample line is a real one (a public benchmark's README quoting its nightly run); the
# others follow log_stats.rs's format string with Deferred / Preemptions / External parts.
RUST = [
    "(RustFrontend pid=3226278) INFO 09-17 15:57:17 [log_stats.rs:273] Avg prompt tput: 672.5 toks/s, "
    "Avg generation tput: 1931.6 toks/s, Reqs Running: 57, Waiting: 0, GPU KV cache used: 1.8%, "
    "Prefix cache hit rate: 0.0%",
    "(RustFrontend pid=3226278) INFO 09-17 15:57:27 [log_stats.rs:273] Avg prompt tput: 8672.5 toks/s, "
    "Avg generation tput: 1031.6 toks/s, Reqs Running: 64, Waiting: 12, Deferred: 2 reqs, Preemptions: 3, "
    "GPU KV cache used: 99.8%, Prefix cache hit rate: 10.0%, External prefix cache hit rate: 5.0%",
]


def _events(lines):
    return [e for e in parse_lines(lines, year=2026) if not isinstance(e, ev.Noise)]


def test_rust_front_end_stats_lines():
    a, b = _events(RUST)
    assert isinstance(a, ev.Stats) and isinstance(b, ev.Stats)
    assert (a.prompt_throughput, a.generation_throughput, a.running, a.waiting, a.gpu_kv_usage,
            a.prefix_cache_hit_rate, a.preemptions) == (672.5, 1931.6, 57, 0, 1.8, 0.0, None)
    assert a.source == "log_stats.rs:273" and a.process == "RustFrontend" and a.pid == 3226278
    assert a.era == "v1" and not a.truncated and a.engine is None
    assert (b.deferred, b.preemptions, b.gpu_kv_usage, b.external_prefix_cache_hit_rate) == (2, 3, 99.8, 5.0)
    assert b.time - a.time == 10


@pytest.mark.parametrize("cut,fields", [
    (", Reqs Running: 57, Wai", {"running": 57, "waiting": None}),
    (", Reqs Running: 57, Waiting: 0, GPU KV cache u", {"waiting": 0, "gpu_kv_usage": None}),
    (", Reqs Ru", {"running": None}),
    (", Reqs Running: 57, Waiting: 0, GPU KV cache used: 1.8%, Prefix cache hit ra",
     {"gpu_kv_usage": 1.8, "prefix_cache_hit_rate": None}),
])
def test_rust_front_end_stats_line_cut_keeps_the_fields_before_the_cut(cut, fields):
    head = RUST[0].split(", Reqs Running")[0]
    e, = _events([head + cut])
    assert isinstance(e, ev.Stats) and e.truncated
    assert e.prompt_throughput == 672.5 and e.generation_throughput == 1931.6
    for k, v in fields.items():
        assert getattr(e, k) == v


def test_rust_front_end_garbled_line_is_unparsed_not_a_wrong_stats():
    e, = _events([RUST[0].replace("Reqs Running: 57", "Reqs Sleeping: 57")])
    assert isinstance(e, ev.Unparsed)


def test_rust_front_end_log_audits_like_a_stats_log(tmp_path):
    lines = []
    for i in range(6):
        lines.append(f"(RustFrontend pid=7) INFO 09-17 15:{57 + i // 6:02d}:{(i * 10) % 60:02d} [log_stats.rs:273] "
                     f"Avg prompt tput: {100.0 * i:.1f} toks/s, Avg generation tput: 50.0 toks/s, "
                     f"Reqs Running: {i}, Waiting: {2 * i}, GPU KV cache used: {10.0 * i:.1f}%, "
                     f"Prefix cache hit rate: 0.0%")
    p = tmp_path / "rust.log"
    p.write_text("\n".join(lines) + "\n")
    rec, = audit_records(str(p), replay=False)
    assert rec["samples"] == 6 and rec["interval_s"] == 10.0
    assert rec["running_max"] == 5 and rec["waiting_max"] == 10 and rec["kv_usage_mean"] == 0.25


# ------------------------------------------------------------------ PR #42827
WARN = ("(EngineCore pid=2978) WARNING 05-07 10:01:02 [scheduler.py:912] Preempting request cmpl-abc123: "
        "480 computed tokens lost (recompute on resume), kv_cache_usage: 99.2% -> 97.1%, num_preemptions=2")


def test_per_victim_preemption_warning_pr_42827():
    e, = _events([WARN])
    assert isinstance(e, ev.PreemptionWarning) and not e.truncated
    assert (e.request_id, e.computed_tokens_lost, e.kv_usage_before, e.kv_usage_after, e.num_preemptions) == \
        ("cmpl-abc123", 480, 99.2, 97.1, 2)
    # the PR's own example, as far as its description shows it (fractions, not percent)
    e, = _events(["WARNING 05-16 10:00:00 [scheduler.py:1] Preempting request cmpl-abc123: 480 computed "
                  "tokens lost (recompute on resume), kv_cache_usage 0.95 -> 0.91"])
    assert (e.kv_usage_before, e.kv_usage_after) == (95.0, 91.0)


@pytest.mark.parametrize("cut,lost", [(": 48", None), (": 480 computed tokens lost (recompute", 480)])
def test_per_victim_preemption_warning_cut(cut, lost):
    head = WARN.split(": 480")[0]
    e, = _events([head + cut])
    assert isinstance(e, ev.PreemptionWarning) and e.truncated
    assert e.request_id == "cmpl-abc123" and e.computed_tokens_lost == lost


def test_per_victim_warnings_are_the_logged_count(tmp_path):
    lines = ["(APIServer pid=1) INFO 05-07 10:00:05 [startup.py:38]   version 0.33.0"]
    for i in range(3):
        lines.append(f"(EngineCore pid=2) WARNING 05-07 10:01:0{i} [scheduler.py:912] Preempting request "
                     f"cmpl-{i}: {100 * (i + 1)} computed tokens lost (recompute on resume), "
                     f"kv_cache_usage: 99.0% -> 95.0%, num_preemptions=1")
        lines.append(f"(APIServer pid=1) INFO 05-07 10:01:0{i} [loggers.py:335] Engine 000: Avg prompt throughput: "
                     "0.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 2 reqs, Waiting: 1 reqs, "
                     "GPU KV cache usage: 99.0%")
    p = tmp_path / "s.log"
    p.write_text("\n".join(lines) + "\n")
    rec, = audit_records(str(p), replay=False)
    assert rec["preemptions_logged"] == 3
    assert rec["preemptions_logged_source"] == "per-victim preemption WARNING lines (vLLM PR #42827)"
