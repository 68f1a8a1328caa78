"""`kvreplay watch --metrics`: vLLM's own preemption counter read beside the log. On p1 the
exact replay (Iteration lines and prompts) names every preemption vLLM 0.33 counted in its
`/metrics` (54, scraped by vLLM's PrometheusStatLogger during the run: metrics.prom.gz)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvreplay.audit.prom import split_scrapes
from kvreplay.errors import UserError
from kvreplay.live.metrics_feed import CounterRow, MetricsFeed, MetricsNotice, metrics_url

P1 = Path(__file__).parent.parent / "data" / "logcases" / "p1_poisson_fcfs_200"


def _scrapes() -> list[str]:
    text = gzip.open(P1 / "metrics.prom.gz", "rt").read()
    return [t for _, t in split_scrapes(text)]


def _page(preemptions: float, running: float = 3, engine: str = "0") -> str:
    lab = f'engine="{engine}",model_name="m"'
    return ("# TYPE vllm:num_preemptions_total counter\n"
            f"vllm:num_preemptions_total{{{lab}}} {preemptions}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{lab}}} {running}\n")


class _Scripted:
    """A fetch that returns the pages (or raises the errors) in order, the last for ever."""

    def __init__(self, pages: list) -> None:
        self.pages, self.i = pages, 0

    def __call__(self, url: str) -> str:
        page = self.pages[min(self.i, len(self.pages) - 1)]
        self.i += 1
        if isinstance(page, Exception):
            raise page
        return page


def _feed(pages: list, named: list[int], final_last: bool = False) -> list:
    clock = iter(range(100, 10_000, 15))
    feed = MetricsFeed("http://127.0.0.1:1/metrics", fetch=_Scripted(pages),
                       now=lambda: float(next(clock)))
    rows: list = []
    for i, n in enumerate(named):
        feed.scrape_now()
        rows += feed.take(n, final=final_last and i == len(named) - 1)
    return rows


def test_a_scrape_gives_the_counters_increase_and_the_logs_count_when_either_moved():
    rows = _feed([_page(10), _page(13, running=7), _page(13), _page(13)], named=[9, 12, 13, 13])
    assert rows == [
        CounterRow(time=115.0, window_s=15.0, preemptions=3, total=3, counter=13, named=12,
                   running=7),
        CounterRow(time=130.0, window_s=15.0, preemptions=0, total=3, counter=13, named=13,
                   running=3),
    ]


def test_the_last_row_is_given_even_when_nothing_moved():
    rows = _feed([_page(10), _page(12), _page(12)], named=[0, 2, 2], final_last=True)
    assert [(r.time, r.counter, r.named) for r in rows] == [(115.0, 12, 2), (130.0, 12, 2)]


def test_a_counter_that_goes_down_was_reset_and_its_new_value_is_the_increase():
    rows = _feed([_page(40), _page(2)], named=[0, 0])
    assert [(r.preemptions, r.reset, r.counter) for r in rows] == [(2, True, 2)]


def test_engines_are_summed():
    both = _page(4, engine="0") + _page(6, engine="1").replace("# TYPE vllm:num_preemptions_total "
                                                              "counter\n", "").replace(
        "# TYPE vllm:num_requests_running gauge\n", "")
    rows = _feed([_page(0, engine="0"), both], named=[0, 0])
    assert [(r.counter, r.running) for r in rows] == [(10, 6)]


def test_an_unreadable_endpoint_is_said_once_until_it_is_read_again():
    err = OSError("connection refused")
    rows = _feed([_page(1), err, err, "not a metrics page {", _page(5)], named=[0] * 5)
    notices = [r.text for r in rows if isinstance(r, MetricsNotice)]
    assert len(notices) == 3  # refused (once for two), not a page, read again
    assert "connection refused" in notices[0] and notices[-1].endswith("read again")
    assert [r.preemptions for r in rows if isinstance(r, CounterRow)] == [4]


def test_a_page_without_the_counter_is_not_taken_for_zero():
    rows = _feed(["# TYPE up gauge\nup 1\n", _page(3)], named=[0, 0])
    assert not [r for r in rows if isinstance(r, CounterRow)]
    assert "not a vLLM /metrics page" in rows[0].text


@pytest.mark.parametrize("spec, url", [
    ("8000", "http://127.0.0.1:8000/metrics"),
    (":9090", "http://127.0.0.1:9090/metrics"),
    ("vllm-0:8000", "http://vllm-0:8000/metrics"),
    ("https://h/x/metrics", "https://h/x/metrics"),
])
def test_metrics_address(spec, url):
    assert metrics_url(spec) == url


@pytest.mark.parametrize("spec", ["file:///etc/passwd", "ftp://h/metrics", "h:port", "http://"])
def test_bad_metrics_address_is_refused(spec):
    with pytest.raises(UserError):
        metrics_url(spec)


class _Server:
    """An HTTP server on loopback serving `page()` at /metrics."""

    def __init__(self, page) -> None:
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = outer.page().encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.page = page
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


def test_watch_prints_vllms_counter_beside_the_exact_replays_rows():
    """p1's finished log watched with its server's last scrape (counter 54): the last row
    is the counter against every row the log gave, 54 and 54."""
    last = _scrapes()[-1]
    srv = _Server(lambda: last)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "kvreplay", "watch", str(P1 / "server.iter.reqbody.log"),
             "--exit-idle", "0.3", "--format", "jsonl", "--metrics", str(srv.port),
             "--metrics-every", "0.2"], capture_output=True, text=True, timeout=600)
    finally:
        srv.close()
    assert out.returncode == 0, out.stderr
    rows = [json.loads(s) for s in out.stdout.splitlines()]
    counters = [r for r in rows if r["event"] == "counter"]
    assert counters, out.stdout[-2000:]
    assert counters[-1]["counter"] == 54 and counters[-1]["named"] == 54
    assert sum(r["event"] == "preemption" for r in rows) == 54


def test_watch_refuses_a_bad_metrics_address_with_one_line():
    out = subprocess.run([sys.executable, "-m", "kvreplay", "watch", "-", "--metrics",
                          "file:///etc/passwd"], input="", capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "--metrics" in out.stderr
