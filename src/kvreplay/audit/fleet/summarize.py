"""`kvreplay audit --summarize DIR/`: the fleet table, read back from the dataset with a
lazy polars scan (only the columns each table needs are read).

Tables: status classes; the worst recompute ratios; the worst preemption storms; the
deployments whose knee is below their max_num_seqs; the inputs that failed.

The knee is metrics.knee (the what-if's definition) on the record's `tput_by_concurrency`
(mean generation throughput of the logged stats lines per bucket of running requests):
the lowest bucket reaching 90% of the peak. A log counts as "knee below max_num_seqs"
when its knee is below max_num_seqs and it ran with more requests than the knee (the
throughput had stopped growing, not the load); a deployment (day-independent) is listed
when that holds for the median of its logs' knees.
"""

from __future__ import annotations

from typing import Any

from kvreplay.audit import metrics as M
from kvreplay.audit.fleet.dataset import scan_dataset

TOP = 10


def summarize(root: str, top: int = TOP) -> dict[str, Any]:
    import polars as pl

    from kvreplay.audit.status import CLASSES

    lf = scan_dataset(root)
    base = lf.select("input_key", "log", "engine", "day", "deployment", "status", "error",
                     "error_kind", "recompute_ratio", "recompute_source", "preemptions_replayed",
                     "preemptions_replayed_low", "preemptions_replayed_high", "recomputed_tokens",
                     "processed_tokens", "max_num_seqs").collect()
    ok = base.filter(pl.col("error").is_null())
    days = sorted(d for d in base["day"].unique().to_list() if d != "unknown")
    out: dict[str, Any] = {
        "dataset": root, "records": base.height, "inputs": base["log"].n_unique(),
        "errors": base.filter(pl.col("error").is_not_null()).height,
        "days": [days[0], days[-1]] if days else [],
        "deployments": ok["deployment"].n_unique(),
    }
    counts = dict(ok.group_by("status").agg(pl.len()).iter_rows())
    logs = dict(ok.group_by("status").agg(pl.col("log").n_unique()).iter_rows())
    deps = dict(ok.group_by("status").agg(pl.col("deployment").n_unique()).iter_rows())
    out["status"] = [{"status": s, "records": counts.get(s, 0), "logs": logs.get(s, 0),
                      "deployments": deps.get(s, 0)}
                     for s in list(CLASSES) + sorted(set(counts) - set(CLASSES))]
    out["worst_recompute"] = (
        ok.filter(pl.col("recompute_ratio").is_not_null())
        .sort(["recompute_ratio", "recomputed_tokens", "log", "engine"],
              descending=[True, True, False, False], nulls_last=True)
        .head(top).select("day", "deployment", "log", "engine", "status", "recompute_ratio",
                          "recompute_source", "preemptions_replayed", "preemptions_replayed_low",
                          "preemptions_replayed_high", "recomputed_tokens", "processed_tokens")
        .to_dicts())
    storms = (lf.filter(pl.col("storms").list.len() > 0)
              .select("day", "deployment", "log", "engine", "storms").explode("storms")
              .unnest("storms").collect())
    out["worst_storms"] = (
        storms.with_columns(pl.col("recomputed_tokens").fill_null(-1).alias("_rt"))
        .sort(["_rt", "preemptions", "log", "start_s"], descending=[True, True, False, False])
        .head(top).drop("_rt").to_dicts())
    out["knee_below_max_num_seqs"] = _knees(
        lf.filter(pl.col("error").is_null() & pl.col("max_num_seqs").is_not_null())
        .select("deployment", "log", "max_num_seqs", "tput_by_concurrency").collect().to_dicts())
    out["failed"] = (base.filter(pl.col("error").is_not_null())
                     .sort("log").select("log", "error_kind", "error").to_dicts())
    return out


def log_knee(rec: dict[str, Any]) -> int | None:
    """The knee of one log's logged throughput by running requests, if below max_num_seqs
    with the log running beyond it; else None."""
    pts = [(b["running"], b["gen_tput"]) for b in rec.get("tput_by_concurrency") or []
           if b.get("gen_tput") is not None]
    if len(pts) < 2:
        return None
    k = M.knee(pts)["knee"]
    if k is None or k >= rec["max_num_seqs"] or k >= max(c for c, _ in pts):
        return None
    return int(k)


def _knees(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[tuple[str, int], list[int | None]] = {}
    for r in rows:
        by.setdefault((r["deployment"], r["max_num_seqs"]), []).append(log_knee(r))
    out = []
    for (dep, mns), knees in sorted(by.items()):
        below = [k for k in knees if k is not None]
        # median over all its logs (a log without a knee below counts as max_num_seqs)
        med = M.quantile([k if k is not None else mns for k in knees], 0.5)
        if below and med is not None and med < mns:
            out.append({"deployment": dep, "max_num_seqs": mns, "logs": len(knees),
                        "logs_below": len(below), "knee_median": med,
                        "knee_min": min(below)})
    return out


def summary_text(s: dict[str, Any], *, markdown: bool = False) -> str:
    from kvreplay.audit.report import shown_row, text_table

    h = (lambda t: f"## {t}\n\n") if markdown else (lambda t: f"{t}\n{'=' * len(t)}\n")
    h3 = (lambda t: f"\n### {t}\n\n") if markdown else (lambda t: f"\n{t}\n{'-' * len(t)}\n")
    span = f", {s['days'][0]} to {s['days'][1]}" if s["days"] else ""
    out = [h(f"kvreplay fleet: {s['inputs']} inputs, {s['records']} records, "
             f"{s['deployments']} deployments{span}, {s['errors']} error rows")]
    out.append(text_table(s["status"], [("status", "status"), ("records", "records"),
                                        ("logs", "logs"), ("deployments", "deployments")],
                          markdown=markdown))
    out.append(h3("worst recompute ratios"))
    out.append(text_table([shown_row(r) for r in s["worst_recompute"]], [
        ("day", "day"), ("deployment", "deployment"), ("log", "log"), ("engine", "eng"),
        ("recompute_ratio", "recompute"), ("preemptions_replayed", "pre replay"),
        ("recomputed_tokens", "recomputed"), ("status", "status")], markdown=markdown)
        if s["worst_recompute"] else "none (no replayed log)\n")
    out.append(h3("worst preemption storms (one stats interval)"))
    out.append(text_table(s["worst_storms"], [
        ("day", "day"), ("log", "log"), ("engine", "eng"), ("start_s", "from s"),
        ("end_s", "to s"), ("preemptions", "preemptions"),
        ("recomputed_tokens", "recomputed"), ("kv_usage", "KV")], markdown=markdown)
        if s["worst_storms"] else "none\n")
    out.append(h3("deployments whose knee is below max_num_seqs"))
    out.append(text_table(s["knee_below_max_num_seqs"], [
        ("deployment", "deployment"), ("max_num_seqs", "max_num_seqs"), ("knee_median", "knee"),
        ("knee_min", "knee min"), ("logs_below", "logs below"), ("logs", "logs")],
        markdown=markdown, short_log=False)
        if s["knee_below_max_num_seqs"] else "none\n")
    if s["failed"]:
        out.append(h3(f"inputs that could not be audited ({len(s['failed'])})"))
        out.append(text_table(s["failed"][:50], [("log", "log"), ("error_kind", "kind"),
                                                 ("error", "reason")], markdown=markdown))
    return "".join(out)
