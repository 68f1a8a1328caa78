"""`kvreplay audit` on the command line: formats, --fail-on exit codes and errors."""

from __future__ import annotations

import json

import polars as pl
import pytest

from kvreplay.audit.expr import Expr, ExprError, compile_fail_on
from kvreplay.cli import main

THIN = "tests/data/corpus/29-v016-queue-drain-full-isl.log"  # stats lines only: fast
DP = "tests/data/corpus/27-v014-dp8-waiting-skew.log"


# ---------------------------------------------------------------- the expression language
def test_expr_evaluates_fields():
    rec = {"recompute_ratio": 0.07, "status": "KV-block bound", "waiting_max": 3,
           "prefix_caching": False, "kv_usage_p95": None}
    fields = list(rec)
    assert Expr("recompute_ratio > 0.05", fields).evaluate(rec)
    assert not Expr("recompute_ratio > 0.1", fields).evaluate(rec)
    assert Expr("status == 'KV-block bound' and waiting_max >= 3", fields).evaluate(rec)
    assert Expr("status in ('KV-block bound', 'x') && not prefix_caching", fields).evaluate(rec)
    assert Expr("waiting_max * 2 - 1 == 5", fields).evaluate(rec)
    assert Expr("0 < recompute_ratio < 1", fields).evaluate(rec)
    # nulls: comparisons are false, `== null` is the test
    assert not Expr("kv_usage_p95 > 0.9", fields).evaluate(rec)
    assert not Expr("kv_usage_p95 <= 0.9", fields).evaluate(rec)
    assert Expr("kv_usage_p95 == null", fields).evaluate(rec)
    assert Expr("kv_usage_p95 == null or kv_usage_p95 > 0.9", fields).evaluate(rec)
    assert not Expr("waiting_max / 0 > 1", fields).evaluate(rec)


@pytest.mark.parametrize("text, message", [
    ("recompute_rato > 0.05", "unknown field 'recompute_rato' (did you mean 'recompute_ratio'?)"),
    ("recompute_ratio >", "cannot parse"),
    ("__import__('os').system('true')", "function calls not allowed"),
    ("status.upper() == 'X'", "not allowed"),
    ("storms > 1", "is a list"),
    ("recompute_ratio ** 2 > 1", "** not allowed"),
    ("", "empty expression"),
    ("status in 'abc'", "'in' needs a list"),
])
def test_expr_errors_are_clear(text, message):
    with pytest.raises(ExprError) as e:
        compile_fail_on(text)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_expr_type_error_at_evaluation():
    e = compile_fail_on("status > 3")
    with pytest.raises(ExprError, match="cannot compare text with a number"):
        e.evaluate({"status": "KV-block bound"})


# ---------------------------------------------------------------- exit codes
def test_fail_on_exit_codes(capsys):
    assert main(["audit", THIN, "--fail-on", "waiting_max > 1000"]) == 0
    capsys.readouterr()
    assert main(["audit", THIN, "--fail-on", "waiting_max > 50"]) == 1
    err = capsys.readouterr().err
    assert "--fail-on 'waiting_max > 50' holds for" in err and "waiting_max=90" in err
    # a fleet fails when any record matches
    assert main(["audit", THIN, DP, "--fail-on", "engine == 1 and kv_time_ge95 >= 0.95"]) == 1


def test_bad_fail_on_exits_2_before_auditing(capsys):
    assert main(["audit", "no-such-file.log", "--fail-on", "recompute_rato > 0.05"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("kvreplay audit: error: --fail-on: unknown field 'recompute_rato'")


def test_missing_file_exits_2(capsys):
    assert main(["audit", "no-such-file.log"]) == 2
    assert "no such file" in capsys.readouterr().err


# ---------------------------------------------------------------- formats
def test_formats(tmp_path, capsys):
    assert main(["audit", THIN, DP, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["engine"] for r in rows] == [None, 0, 1, 2]  # DP: engines 0, 1 and the cut line of engine 2
    assert rows[0]["status"] == "not established"

    assert main(["audit", THIN, "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("## kvreplay audit: 1 record") and "| log | status |" in md  # eng: only for data-parallel logs

    assert main(["audit", THIN]) == 0
    table = capsys.readouterr().out
    assert "not established" in table and "null: replay fields" in table

    out = tmp_path / "fleet.parquet"
    assert main(["audit", THIN, DP, "--format", "parquet", "-o", str(out)]) == 0
    df = pl.read_parquet(out)
    assert df.height == 4 and "recompute_ratio" in df.columns
    html = (tmp_path / "fleet.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "<script" not in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")

    assert main(["audit", THIN, "--format", "parquet"]) == 2
    assert "needs -o" in capsys.readouterr().err


def test_output_is_deterministic(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["audit", THIN, DP, "--format", "json", "-o", str(a), "-j", "2"]) == 0
    assert main(["audit", THIN, DP, "--format", "json", "-o", str(b), "-j", "1"]) == 0
    assert a.read_text() == b.read_text()
    assert (tmp_path / "a.html").read_text() == (tmp_path / "b.html").read_text()


def test_folder_of_logs(tmp_path, capsys):
    import shutil

    shutil.copy(THIN, tmp_path / "x.log")
    shutil.copy(DP, tmp_path / "y.log")
    assert main(["audit", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["log"].rsplit("/", 1)[1] for r in rows] == ["x.log", "y.log", "y.log", "y.log"]  # y: engines 0, 1, 2
