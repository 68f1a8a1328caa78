"""One server, one record: a vLLM log and the Prometheus scrapes of the same server."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
import re

import pytest

from kvreplay.audit.record import audit_records

CASE = str(Path(__file__).resolve().parents[2] / "data" / "logcases" / "p1_poisson_fcfs_200")
LOG = os.path.join(CASE, "server.default.log")
PROM = os.path.join(CASE, "metrics.prom.gz")
assert os.path.exists(PROM), "p1's scrapes missing from tests/data"


def _scrapes(tmp_path, *, model=None, shift=0.0):
    with gzip.open(PROM, "rt", encoding="utf-8") as f:
        text = f.read()
    if model:
        text = text.replace('model_name="meta-llama/Llama-3.1-8B-Instruct"', f'model_name="{model}"')
    if shift:
        text = re.sub(r"# SCRAPE (\S+)", lambda m: f"# SCRAPE {float(m.group(1)) + shift:.3f}", text)
    p = tmp_path / "m.prom"
    p.write_text(text)
    return str(p)


def test_default_log_and_its_scrapes_are_one_record():
    recs = audit_records([LOG, PROM], replay=False)
    assert len(recs) == 1
    r = recs[0]
    assert r["source"] == "vllm log + prometheus"
    assert r["metrics_join"].startswith("joined by model and time")
    # from the log: its config and stats lines
    assert (r["max_model_len"], r["num_gpu_blocks"], r["samples"], r["interval_s"]) == (4096, 2000, 16, 2.0)
    # from the scrapes: the preemption counter (truth.json: 54) and the latency histograms
    assert r["preemptions_logged"] == 54
    assert "vllm:num_preemptions_total" in r["preemptions_logged_source"]
    assert r["latency_source"].startswith("logged: prometheus")
    # one status, which now knows the preemptions (the log alone said "unknown")
    assert r["status"] == "KV-block bound" and "54 preemptions" in r["status_evidence"]
    alone, = audit_records(LOG, replay=False)
    assert "preemptions unknown" in alone["status_evidence"]


def test_scrapes_of_another_model_are_not_joined(tmp_path):
    recs = audit_records([LOG, _scrapes(tmp_path, model="Qwen/Qwen3-8B")], replay=False)
    assert [r["source"] for r in recs] == ["vllm log", "prometheus"]
    for r in recs:
        assert r["metrics_join"].startswith("not joined: the scrapes serve 'Qwen/Qwen3-8B'")
    assert recs[0]["preemptions_logged"] is None


def test_scrapes_of_another_day_are_not_joined(tmp_path):
    recs = audit_records([LOG, _scrapes(tmp_path, shift=3 * 86400 + 1234.0)], replay=False)
    assert len(recs) == 2
    why = recs[0]["metrics_join"]
    assert why.startswith("not joined: the scrapes' time span does not overlap the log's")
    # 3 days and 1,234 s later, less the log's own span: 72.3 h, not a time zone's shift
    assert "72.3 h after it ends" in why and "quarter hours" in why


def test_log_clock_in_another_time_zone_is_joined_and_said(tmp_path):
    # the log prints local time; the scrapes are UTC epoch seconds: 2 h apart
    recs = audit_records([LOG, _scrapes(tmp_path, shift=-7200.0)], replay=False)
    assert len(recs) == 1
    assert "+2.00 h from the scrapes'" in recs[0]["metrics_join"]
    assert recs[0]["preemptions_logged"] == 54


def test_fleet_dataset_carries_the_joined_record(tmp_path):
    from kvreplay.audit.fleet import Options, make_executor, run
    from kvreplay.audit.fleet.dataset import scan_dataset
    from kvreplay.audit.join import pair

    paths, metrics = pair([LOG, PROM])
    assert paths == [LOG] and metrics == ((LOG, (PROM,)),)
    ex = make_executor("local", 1)
    try:
        out = str(tmp_path / "ds")
        fr = run(paths, ex, options=Options(None, False, None, metrics), out_dir=out)
        assert fr.errors == []
        rows = scan_dataset(out).collect().to_dicts()
        assert len(rows) == 1
        assert rows[0]["log"] == LOG and rows[0]["source"] == "vllm log + prometheus"
        assert rows[0]["preemptions_logged"] == 54 and rows[0]["metrics"] == PROM
        # a rerun over the same inputs writes nothing; changed scrapes are audited again
        fr2 = run(paths, ex, options=Options(None, False, None, metrics), out_dir=out)
        assert fr2.skipped == 1
    finally:
        ex.close()


def test_an_export_of_several_servers_joins_the_logs_own(tmp_path):
    import json

    from kvreplay.audit import prom

    # p1's scrapes as a query_range export of two instances: ours, and another server's
    # whose counter says 999
    sc = prom.read_scrapes(PROM)
    result = []
    for inst, bump in (("other:8000", 999.0), ("ours:8000", 0.0)):
        for key, name in (("preemptions", "vllm:num_preemptions_total"), ("running", "vllm:num_requests_running"),
                          ("waiting", "vllm:num_requests_waiting")):
            vals = [[s.time + (7200.0 if inst == "other:8000" else 0.0), str(s.values["0"][key] + (bump if key == "preemptions" else 0))]
                    for s in sc]
            result.append({"metric": {"__name__": name, "instance": inst, "engine": "0",
                                      "model_name": "meta-llama/Llama-3.1-8B-Instruct"}, "values": vals})
    p = tmp_path / "export.json"
    p.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    rec, = audit_records([LOG, str(p)], replay=False)
    assert rec["metrics"].endswith("instance=ours:8000") and rec["preemptions_logged"] == 54
