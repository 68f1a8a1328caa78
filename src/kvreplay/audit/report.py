"""Text, Markdown, JSON and HTML renderings of audit records and what-if results."""

from __future__ import annotations

import json
from html import escape
from typing import Any, Sequence

from kvreplay.audit import svg
from kvreplay.words import count

FLEET_COLUMNS = [
    ("log", "log"), ("engine", "eng"), ("status", "status"), ("kv_usage_p95", "KV p95"),
    ("kv_time_ge95", "KV>=95%"), ("waiting_max", "wait max"), ("preemptions_logged", "pre log"),
    ("preemptions_replayed", "pre replay"), ("recompute_ratio", "recompute"),
    ("requests", "reqs"), ("gen_tput_mean", "gen tok/s"), ("ttft_p95_s", "TTFT p95 s"),
]


def fleet_columns(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """FLEET_COLUMNS, without `eng` when no row is one engine of a data-parallel log."""
    if any(r.get("engine") is not None for r in rows):
        return FLEET_COLUMNS
    return [c for c in FLEET_COLUMNS if c[0] != "engine"]


def shown_row(r: dict[str, Any]) -> dict[str, Any]:
    """A record as the tables show it: the replayed preemptions as their interval where
    the record has one (as the report's headline), a figure from estimated prompt lengths
    marked `~`."""
    out = dict(r)
    lo, hi = r.get("preemptions_replayed_low"), r.get("preemptions_replayed_high")
    if lo is not None and hi is not None and lo != hi:
        out["preemptions_replayed"] = f"{lo}-{hi}"
    if r.get("recompute_ratio") is not None and "estimated" in (r.get("recompute_source") or ""):
        out["recompute_ratio"] = "~" + fmt(r["recompute_ratio"], "recompute_ratio")
    return out


def fmt(v: Any, key: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if key.startswith("knee") and v.is_integer():  # a setting's value: 29, not 29.0
            return str(int(v))
        if key in ("start_s", "end_s", "t"):
            return f"{v:g}"
        if key in ("kv_usage_p95", "kv_time_ge95", "kv_usage_mean", "recompute_ratio",
                   "replay_agreement", "replay_exact", "longest_seq_pool_share", "kv_usage"):
            return f"{100 * v:.1f}%"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    return str(v)


def _short(path: str, width: int = 38) -> str:
    return path if len(path) <= width else "…" + path[-(width - 1):]


def text_table(rows: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str]], *,
               markdown: bool = False, short_log: bool = True) -> str:
    cells = [[h for _, h in cols]]
    for r in rows:
        line = []
        for k, _ in cols:
            v = r.get(k)
            s = _short(v) if (k == "log" and short_log and isinstance(v, str)) else fmt(v, k)
            line.append(s)
        cells.append(line)
    if markdown:
        out = ["| " + " | ".join(c.replace("|", "\\|") for c in cells[0]) + " |",
               "|" + "|".join("---" for _ in cols) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells[1:]]
        return "\n".join(out) + "\n"
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    num = [all(_numeric(row[i]) for row in cells[1:]) for i in range(len(cols))]
    out = []
    for j, row in enumerate(cells):
        out.append("  ".join(c.rjust(widths[i]) if num[i] and j else c.ljust(widths[i])
                             for i, c in enumerate(row)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out) + "\n"


def _numeric(s: str) -> bool:
    t = s.lstrip("~").replace(",", "").replace("%", "").replace("-", "", 1).replace(".", "", 1)
    return t.isdigit() or s == "-"


# ---------------------------------------------------------------- audit
def audit_text(rows: list[dict[str, Any]], *, markdown: bool = False) -> str:
    h = (lambda s: f"## {s}\n\n") if markdown else (lambda s: f"{s}\n{'=' * len(s)}\n")
    h3 = (lambda s: f"### {s}\n\n") if markdown else (lambda s: f"\n{s}\n{'-' * len(s)}\n")
    out = [h(f"kvreplay audit: {len(rows)} record{'s' if len(rows) != 1 else ''}")]
    out.append(text_table([shown_row(r) for r in rows], fleet_columns(rows), markdown=markdown))
    for r in rows:
        name = r["log"] + ("" if r.get("engine") is None else f" (engine {r['engine']})")
        out.append("\n" + h3(name))
        b = "- " if markdown else "  "
        out.append(f"{b}status: {r['status']}: {r['status_evidence']}\n")
        cfg = []
        for k in ("vllm_version", "profile", "model", "max_num_seqs", "running_max", "running_typical",
                  "max_num_batched_tokens", "max_model_len", "block_size", "num_gpu_blocks",
                  "max_concurrency_x", "chunked_prefill", "prefix_caching", "policy", "preemption_mode"):
            if r.get(k) is not None:
                cfg.append(f"{k}={fmt(r[k], k)}")
        if r.get("max_num_seqs_source") and r["max_num_seqs_source"] != "log":
            cfg.append(f"(max_num_seqs: {r['max_num_seqs_source']})")
        out.append(f"{b}scheduler: {' '.join(cfg) or '-'}\n")
        cnt = [f"{k}={fmt(r.get(k), k)}" for k in (
            "running_mean", "waiting_mean", "waiting_max", "deferred_max", "kv_usage_mean",
            "kv_usage_p95", "kv_time_ge95", "preemptions_logged", "preemptions_replayed",
            "requests_preempted", "recomputed_tokens", "processed_tokens", "recompute_ratio")
            if r.get(k) is not None]
        out.append(f"{b}counters: {' '.join(cnt) or '-'}\n")
        if r.get("preemptions_replayed_low") is not None:
            out.append(f"{b}preemptions replayed: {r['preemptions_replayed']} (interval "
                       f"{r['preemptions_replayed_low']}-{r['preemptions_replayed_high']}, median "
                       f"{r.get('preemptions_replayed_median')}: "
                       f"{r.get('preemptions_interval_source')})\n")
        wl = [f"{k}={fmt(r.get(k), k)}" for k in (
            "requests", "arrival_rate_rps", "concurrency_mean", "concurrency_max", "input_len_mean",
            "input_len_p95", "input_len_max", "output_len_mean", "output_len_p95", "output_len_max")
            if r.get(k) is not None]
        if wl:
            out.append(f"{b}workload: {' '.join(wl)}" + (f" ({r['lengths_source']})" if r.get("lengths_source") else "") + "\n")
        perf = [f"{k}={fmt(r.get(k), k)}" for k in (
            "prompt_tput_mean", "gen_tput_mean", "gen_tput_max", "ttft_p50_s", "ttft_p95_s",
            "itl_p50_s", "itl_p95_s") if r.get(k) is not None]
        if perf:
            out.append(f"{b}perf: {' '.join(perf)}" + (f" (latency {r['latency_source']})" if r.get("latency_source") else "") + "\n")
        if r.get("tput_by_concurrency"):
            tb = ", ".join(f"<={t['running']}: {t['gen_tput']:.0f}" for t in r["tput_by_concurrency"])
            out.append(f"{b}generation tok/s by running requests: {tb}\n")
        if r.get("step_time_model"):
            exact = (f", exactly {fmt(r['replay_exact'], 'replay_exact')}"
                     if r.get("replay_exact") is not None else "")
            out.append(f"{b}replay: {r['step_time_model']}; stats lines agreeing "
                       f"{fmt(r.get('replay_agreement'), 'replay_agreement')}{exact}\n")
        if r.get("spans_joined") is not None:
            out.append(f"{b}request spans: {r['spans_joined']} requests joined (coverage "
                       f"{100 * r['spans_coverage']:.0f}%), exporter clock offset "
                       f"{r['spans_clock_offset_s']:+.3f} s, {r['spans_contradicted']} "
                       "contradicted by the replay\n")
        if r.get("storms"):
            out.append(f"{b}worst preemption storms (windows with the most recomputed tokens, "
                       "in time order):\n")
            for s in sorted(r["storms"], key=lambda s: s["start_s"]):
                out.append(f"{b}  t={s['start_s']:g}-{s['end_s']:g}s: "
                           f"{count(s['preemptions'], 'preemption')}, "
                           f"{fmt(s['recomputed_tokens'])} tokens recomputed"
                           + (f", KV {fmt(s['kv_usage'], 'kv_usage')}" if s.get("kv_usage") is not None else "") + "\n")
        if r.get("worst_requests"):
            out.append(f"{b}requests hurt most:\n")
            for w in r["worst_requests"]:
                out.append(f"{b}  {w['request']}: {count(w['preemptions'], 'preemption')}, "
                           f"{w['recomputed_tokens']} tokens recomputed, {w['time_lost_s']:g}s waiting to resume\n")
        for reason in r.get("null_reasons") or []:
            out.append(f"{b}null: {reason}\n")
    return "".join(out)


def to_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, indent=1, ensure_ascii=False, default=str) + "\n"


_STATUS_COLOR = {"KV-block bound": "#d62728", "single-sequence-length bound": "#9467bd",
                 "prefill interference": "#ff7f0e", "not established": "#7f7f7f"}

_CSS = """body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}.st{color:#fff;padding:1px 6px;border-radius:3px;white-space:nowrap}
h2{margin-top:36px;border-bottom:1px solid #ccc}.ev{font-size:13px;color:#333}.null{font-size:12px;color:#777}
.charts svg{display:block;margin:10px 0;border:1px solid #eee}"""


def _page(title: str, body: list[str]) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>" + "".join(body) + "</body></html>\n")


def _html_table(rows, cols) -> str:
    out = ["<table><tr>" + "".join(f"<th class='l'>{escape(h)}</th>" if k in ("log", "status", "setting", "request")
                                   else f"<th>{escape(h)}</th>" for k, h in cols) + "</tr>"]
    for r in rows:
        tds = []
        for k, _ in cols:
            v = r.get(k)
            if k == "status" and v:
                tds.append(f"<td class='l'><span class='st' style='background:{_STATUS_COLOR.get(v, '#555')}'>{escape(v)}</span></td>")
            elif k in ("log", "setting", "request"):
                tds.append(f"<td class='l'>{escape(str(v))}</td>")
            else:
                tds.append(f"<td>{escape(fmt(v, k))}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    return "".join(out) + "</table>"


def audit_html(rows: list[dict[str, Any]]) -> str:
    body = [f"<h1>kvreplay audit</h1><p>{len(rows)} record(s). Status rules and field definitions: "
            "kvreplay README, section <i>audit</i>.</p>", _html_table([shown_row(r) for r in rows], fleet_columns(rows))]
    for r in rows:
        name = r["log"] + ("" if r.get("engine") is None else f" (engine {r['engine']})")
        body.append(f"<h2>{escape(name)}</h2>")
        body.append(f"<p class='ev'><span class='st' style='background:{_STATUS_COLOR.get(r['status'], '#555')}'>"
                    f"{escape(r['status'])}</span> {escape(r['status_evidence'] or '')}</p>")
        body.append("<div class='charts'>")
        tl = r.get("timeline") or []
        rtl = r.get("replay_timeline") or []
        kv_series = []
        if rtl:
            kv_series.append({"label": "replayed (max per bucket)", "points": [(p["t"], 100 * p["kv_usage"]) for p in rtl],
                              "color": "#9ecae1", "dots": False, "width": 1.5, "dash": False})
        if tl:
            kv_series.append({"label": "logged (stats lines)", "points": [(p["t"], None if p["kv_usage"] is None else 100 * p["kv_usage"]) for p in tl],
                              "color": svg.PALETTE[0], "dash": False, "width": 2.5})
        body.append(svg.line_chart(kv_series, title="KV cache usage over time", xlabel="seconds from the first request / stats line",
                                   ylabel="KV usage %", y_min=0, y_max=105, hlines=[(95, "95%")]))
        xs = [p["t"] for p in tl] + [p["t"] for p in rtl]
        xr = (min(xs), max(xs)) if xs else None
        if rtl and any(p["preemptions"] for p in rtl):
            body.append(svg.timeline_bars([(p["t"], p["preemptions"]) for p in rtl], title="Preemptions over time (replayed)",
                                          ylabel="preemptions", xlabel="seconds", x_range=xr))
        elif any(p.get("preemptions") for p in tl):
            body.append(svg.timeline_bars([(p["t"], p["preemptions"] or 0) for p in tl], title="Preemptions over time (logged, per interval)",
                                          ylabel="preemptions", xlabel="seconds", x_range=xr))
        else:
            why = "none replayed or logged" if r.get("replay") == "ok" or r.get("preemptions_logged") == 0 else "not in the input"
            body.append(svg.timeline_bars([], title=f"Preemptions over time ({why})", ylabel="preemptions",
                                          xlabel="seconds", x_range=xr))
        if tl:
            body.append(svg.line_chart(
                [{"label": "running", "points": [(p["t"], p["running"]) for p in tl], "color": svg.PALETTE[2],
                  "dash": False, "width": 2},
                 {"label": "waiting", "points": [(p["t"], p["waiting"]) for p in tl], "color": svg.PALETTE[3],
                  "dash": False, "width": 2}],
                title="Running and waiting requests (logged)", xlabel="seconds", ylabel="requests", yint=True))
        tbc = r.get("tput_by_concurrency") or []
        if len(tbc) > 1:
            body.append(svg.line_chart([{"label": "generation tok/s", "points": [(t["running"], t["gen_tput"]) for t in tbc]}],
                                       title="Throughput by concurrency (logged stats lines)",
                                       xlabel="running requests (bucket upper bound)", ylabel="tokens/s"))
        body.append("</div>")
        if r.get("storms"):
            body.append("<h3>Worst preemption storms</h3>" + _html_table(r["storms"], [
                ("start_s", "from s"), ("end_s", "to s"), ("preemptions", "preemptions"),
                ("recomputed_tokens", "tokens recomputed"), ("kv_usage", "KV usage")]))
        if r.get("worst_requests"):
            body.append("<h3>Requests hurt most</h3>" + _html_table(r["worst_requests"], [
                ("request", "request"), ("preemptions", "preemptions"), ("recomputed_tokens", "tokens recomputed"),
                ("time_lost_s", "s waiting to resume")]))
        for reason in r.get("null_reasons") or []:
            body.append(f"<p class='null'>null: {escape(reason)}</p>")
    return _page("kvreplay audit", body)


# ---------------------------------------------------------------- what-if
WHATIF_COLUMNS = [
    ("setting", "setting"), ("concurrency", "clients"), ("preemptions", "preempt"),
    ("preemptions_range", "preempt range"),
    ("requests_preempted", "victims"), ("recompute_ratio", "recompute"),
    ("output_tput", "out tok/s"), ("output_tput_range", "tok/s range"), ("requests_per_s", "req/s"), ("ttft_p50_s", "TTFT p50"),
    ("ttft_p95_s", "TTFT p95"), ("itl_p50_s", "ITL p50"), ("kv_usage_mean", "KV mean"),
    ("completed", "done"), ("note", "note"),
]


def whatif_text(res: dict[str, Any], *, markdown: bool = False) -> str:
    h = (lambda s: f"## {s}\n\n") if markdown else (lambda s: f"{s}\n{'=' * len(s)}\n")
    b = "- " if markdown else ""
    out = [h(f"kvreplay whatif: {res['log']}")]
    out.append(f"{b}step-time model: {res['model']} (fitted on {res['fit']})\n")
    out.append(f"{b}{res['mode']}\n")
    for n in res.get("notes", []):
        out.append(f"{b}note: {n}\n")
    out.append("\n")
    cols = [c for c in WHATIF_COLUMNS if any(r.get(c[0]) is not None for r in res["rows"])]
    out.append(text_table(res["rows"], cols, markdown=markdown, short_log=False))
    if res.get("knees"):
        out.append("\n" + (h("knee of throughput vs concurrency") if markdown else "knee of throughput vs concurrency:\n"))
        for k in res["knees"]:
            out.append(f"{b}{k['text']}\n")
    trusted = [r for r in res["rows"] if r.get("trust")]
    if trusted:
        out.append("\n" + (h("which rows to act on") if markdown else "which rows to act on:\n"))
        for r in trusted:
            out.append(f"{b}{r['setting']}{'' if r.get('concurrency') is None else ' x ' + str(r['concurrency'])}: {r['trust']}\n")
    if res.get("seqs_knee"):
        out.append(f"\n{b}{res['seqs_knee']['text']}\n")
    return "".join(out)


def whatif_html(res: dict[str, Any]) -> str:
    body = [f"<h1>kvreplay whatif</h1><p>{escape(res['log'])}</p>",
            f"<p class='ev'>Step-time model: {escape(res['model'])} (fitted on {escape(res['fit'])}). "
            f"{escape(res['mode'])}</p>"]
    for n in res.get("notes", []):
        body.append(f"<p class='null'>note: {escape(n)}</p>")
    body.append("<div class='charts'>")
    rows = res["rows"]
    closed = [r for r in rows if r.get("concurrency") is not None]
    if closed:
        series, markers = [], []
        settings = list(dict.fromkeys(r["setting"] for r in closed))
        for i, s in enumerate(settings):
            pts = [(r["concurrency"], r["output_tput"]) for r in closed if r["setting"] == s]
            color = svg.PALETTE[i % len(svg.PALETTE)]
            series.append({"label": s, "points": pts, "color": color})
            k = next((k for k in res.get("knees", []) if k["setting"] == s), None)
            if k and k.get("knee") is not None:
                y = next(t for c, t in pts if c == k["knee"])
                markers.append({"x": k["knee"], "y": y, "label": f"knee {k['knee']}", "color": color})
        xt = sorted({r["concurrency"] for r in closed})
        body.append(svg.line_chart(series, title="Output throughput vs concurrency (closed loop, simulated)",
                                   xlabel="concurrent clients (--max-concurrency)", ylabel="output tokens/s",
                                   markers=markers, xticks=xt, height=340))
        pre_series = []
        for i, s in enumerate(settings):
            pre_series.append({"label": s, "points": [(r["concurrency"], r["preemptions"]) for r in closed if r["setting"] == s],
                               "color": svg.PALETTE[i % len(svg.PALETTE)]})
        body.append(svg.line_chart(pre_series, title="Preemptions vs concurrency", xlabel="concurrent clients",
                                   ylabel="preemptions", xticks=xt, yint=True))
    open_rows = [r for r in rows if r.get("concurrency") is None]
    if open_rows:
        body.append(svg.bar_chart([(r["setting"], r.get("preemptions")) for r in open_rows],
                                  title="Preemptions per setting (logged arrivals)", ylabel="preemptions"))
        body.append(svg.bar_chart([(r["setting"], r.get("output_tput")) for r in open_rows],
                                  title="Output throughput per setting (logged arrivals)", ylabel="tokens/s",
                                  color=svg.PALETTE[0]))
    body.append("</div>")
    cols = [c for c in WHATIF_COLUMNS if any(r.get(c[0]) is not None for r in rows)]
    body.append(_html_table(rows, cols))
    for k in res.get("knees", []):
        body.append(f"<p class='ev'>{escape(k['text'])}</p>")
    for r in rows:
        if r.get("trust"):
            body.append(f"<p class='ev'>{escape(str(r['setting']))}: {escape(r['trust'])}</p>")
    if res.get("seqs_knee"):
        body.append(f"<p class='ev'>{escape(res['seqs_knee']['text'])}</p>")
    return _page("kvreplay whatif", body)
