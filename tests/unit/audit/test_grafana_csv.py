"""Grafana's "Download CSV" of vLLM series as Prometheus input (issue 30,
audit/grafana_csv.py): hand-written CSVs in the formats Grafana writes (the data-frame
CSV of 7.0+, joined by time or one frame per series; the old `Series;Time;Value`), the
same samples as query_range JSON give the same scrapes, and p1's scrapes exported as a
CSV audit to the record of the scrape file."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
from pathlib import Path

import pytest

from kvreplay.audit.prom import looks_like_prometheus, read_scrapes
from kvreplay.audit.record import audit_records
from kvreplay.cli import main
from kvreplay.errors import UserError

CASE = Path(__file__).resolve().parents[2] / "data" / "logcases" / "p1_poisson_fcfs_200"
PROM = CASE / "metrics.prom.gz"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
T0 = 1778148060  # 2026-05-07 10:01:00 UTC

# Grafana 10's Inspect > Data > Download CSV of three series, "Series joined by time",
# "Formatted data" on (dates in the dashboard's zone, the KV gauge's percent unit), with
# Excel's `sep=` line and CRLF rows; the second stamp lacks the running gauge.
JOINED = (
    'sep=,\r\n'
    '"Time","vllm:num_preemptions_total{engine=""0"", instance=""gpu-a:8000"", job=""vllm"", '
    f'model_name=""{MODEL}""}}","vllm:num_requests_running{{engine=""0"", '
    f'instance=""gpu-a:8000"", job=""vllm"", model_name=""{MODEL}""}}",'
    f'"vllm:kv_cache_usage_perc{{engine=""0"", instance=""gpu-a:8000"", job=""vllm"", '
    f'model_name=""{MODEL}""}}"\r\n'
    '2026-05-07 10:01:00,0,3,90.5%\r\n'
    '2026-05-07 10:01:15,4,,92.1%\r\n'
    '2026-05-07 10:01:30,7,2,41%\r\n')


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, newline="")
    return str(p)


def test_joined_by_time_hand_written(tmp_path: Path) -> None:
    path = _write(tmp_path, "panel.csv", JOINED)
    assert looks_like_prometheus(path)
    sc = read_scrapes(path)
    assert [s.time for s in sc] == [T0, T0 + 15, T0 + 30]
    assert [s.values["0"]["preemptions"] for s in sc] == [0.0, 4.0, 7.0]
    assert sc[0].values["0"]["running"] == 3.0 and "running" not in sc[1].values["0"]
    assert sc[0].values["0"]["kv_usage"] == pytest.approx(0.905)
    assert sc[2].values["0"]["kv_usage"] == pytest.approx(0.41)
    assert {s.model for s in sc} == {MODEL} and {s.instance for s in sc} == {"gpu-a:8000"}


def test_the_same_series_as_query_range_json_give_the_same_scrapes(tmp_path: Path) -> None:
    labels = {"engine": "0", "instance": "gpu-a:8000", "job": "vllm", "model_name": MODEL}
    result = [
        {"metric": {"__name__": "vllm:num_preemptions_total", **labels},
         "values": [[T0, "0"], [T0 + 15, "4"], [T0 + 30, "7"]]},
        {"metric": {"__name__": "vllm:num_requests_running", **labels},
         "values": [[T0, "3"], [T0 + 30, "2"]]},
        {"metric": {"__name__": "vllm:kv_cache_usage_perc", **labels},
         "values": [[T0, "0.905"], [T0 + 15, "0.921"], [T0 + 30, "0.41"]]},
    ]
    js = _write(tmp_path, "q.json", json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}))
    a = read_scrapes(_write(tmp_path, "panel.csv", JOINED))
    b = read_scrapes(js)
    assert [(s.time, s.instance, s.model) for s in a] == [(s.time, s.instance, s.model) for s in b]
    for x, y in zip(a, b):
        assert x.values.keys() == y.values.keys()
        for eng in x.values:
            assert x.values[eng] == pytest.approx(y.values[eng])


def test_one_frame_per_series_epoch_ms_semicolons(tmp_path: Path) -> None:
    # not joined: each series its own header and rows; raw (unformatted) epoch ms; a
    # locale whose list separator is ';'
    text = ('"Time";"vllm:num_preemptions_total{engine=""0""}"\r\n'
            f'{T0 * 1000};0\r\n{(T0 + 10) * 1000};5\r\n'
            '"Time";"vllm:num_requests_waiting{engine=""0""}"\r\n'
            f'{T0 * 1000};9\r\n{(T0 + 10) * 1000};1\r\n')
    sc = read_scrapes(_write(tmp_path, "frames.csv", text))
    assert [s.time for s in sc] == [T0, T0 + 10]
    assert sc[0].values["0"] == {"preemptions": 0.0, "waiting": 9.0}
    assert sc[1].values["0"] == {"preemptions": 5.0, "waiting": 1.0}


def test_grafana_6_series_time_value_rows(tmp_path: Path) -> None:
    text = ('Series;Time;Value\n'
            'vllm:num_preemptions_total{engine="0"};2026-05-07T10:01:00+00:00;2\n'
            'vllm:num_preemptions_total{engine="0"};2026-05-07T10:01:10+00:00;6\n')
    path = _write(tmp_path, "old.csv", text)
    assert looks_like_prometheus(path)
    sc = read_scrapes(path)
    assert [(s.time, s.values["0"]["preemptions"]) for s in sc] == [(T0, 2.0), (T0 + 10, 6.0)]


def test_a_legend_name_is_refused_with_the_fix(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, "legend.csv", '"Time","vllm:num_preemptions_total{engine=""0""}",'
                  '"Preemptions"\r\n2026-05-07 10:01:00,,4\r\n')
    with pytest.raises(UserError, match="no column names a vLLM series .*'Preemptions'.*legend"):
        read_scrapes(path)
    empty = _write(tmp_path, "empty.csv", '"Time","vllm:num_preemptions_total"\r\n')
    with pytest.raises(UserError, match="a header and no sample rows"):
        read_scrapes(empty)
    named = _write(tmp_path, "named.csv", '"Time","Preemptions","Running"\r\n'
                   "2026-05-07 10:01:00,1,2\r\n")
    assert not looks_like_prometheus(named)  # no vLLM series: not taken for metrics
    bad = _write(tmp_path, "bad.csv", '"Time","vllm:num_requests_running"\r\n'
                 "2026-05-07 10:01:00,3 reqs\r\n")
    assert main(["audit", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.csv:2: value '3 reqs' is not a number" in err


def test_p1_scrapes_as_a_csv_audit_to_the_scrape_files_record(tmp_path: Path) -> None:
    assert PROM.is_file()
    with gzip.open(PROM, "rt", encoding="utf-8") as f:
        text = f.read()
    # every sample of the scrape file, read here by a plain regex (not the code under test)
    rx = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$')
    t, cols, rows = None, {}, {}
    for line in text.splitlines():
        if line.startswith("# SCRAPE"):
            t = int(float(line.split()[2]))
            continue
        if not line or line.startswith("#"):
            continue
        m = rx.match(line)
        assert m, line
        col = f"{m.group(1)}{{{m.group(2) or ''}}}"
        cols.setdefault(col, len(cols))
        rows.setdefault(t, {})[col] = m.group(3)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    w.writerow(["Time", *cols])
    for ts in sorted(rows):
        w.writerow([ts * 1000, *(rows[ts].get(c, "") for c in cols)])
    path = _write(tmp_path, "p1.csv", buf.getvalue())
    csv_rec, = audit_records(path)
    prom_rec, = audit_records(str(PROM))
    diff = {k: (csv_rec[k], prom_rec[k]) for k in prom_rec if k != "log" and csv_rec[k] != prom_rec[k]}
    assert not diff
    assert csv_rec["preemptions_logged"] == 54  # truth.json: 54 preemptions
    assert os.path.basename(csv_rec["log"]).startswith("p1.csv")
