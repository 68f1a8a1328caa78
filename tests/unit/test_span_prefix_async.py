"""span_prefix.windows_read: under asynchronous scheduling the prefill windows are not read
for hits (spec A9: step k+1 is scheduled before step k's output is processed), and
span_prefix.pinned keeps the replay it was given, reading nothing."""

from __future__ import annotations

from types import SimpleNamespace

from kvreplay.inference import span_prefix


def _rebuilt(asyn: bool) -> SimpleNamespace:
    return SimpleNamespace(workload=SimpleNamespace(
        config=SimpleNamespace(async_scheduling=asyn, block_size=16), requests=[]))


def test_windows_are_read_only_under_sync_scheduling():
    assert span_prefix.windows_read(_rebuilt(False)) is True
    assert span_prefix.windows_read(_rebuilt(True)) is False


def test_async_run_keeps_the_replay_given_and_reads_no_hit(monkeypatch):
    def boom(*a, **k):  # the windows must not be priced at all
        raise AssertionError("hit_model called under async scheduling")

    monkeypatch.setattr(span_prefix, "hit_model", boom)
    shown, run = _rebuilt(True), SimpleNamespace(model=None)
    out = span_prefix.pinned(object(), shown, object(), object(), object(), object(), run, 7,
                             False)
    assert out == (shown, run, 7, None)
    # the same call under sync scheduling does price the windows
    sync = _rebuilt(False)
    try:
        span_prefix.pinned(object(), sync, object(), object(), object(), object(), run, 7, False)
    except AssertionError as e:
        assert "hit_model called" in str(e)
    else:
        raise AssertionError("sync scheduling did not read the windows")


def test_the_hits_replace_the_one_prefix_only_from_min_hits_read(monkeypatch):
    """span_prefix.MIN_HITS: with fewer hits read the replay given stays (a few windows
    hold the envelope fit loosely and every hit moves with its error); with that many the
    sharing they imply is replayed."""
    sync = _rebuilt(False)
    run = SimpleNamespace(model="fitted")
    monkeypatch.setattr(span_prefix, "hit_model", lambda *a: "envelope")
    monkeypatch.setattr(span_prefix, "filled", lambda hits, *a: hits)
    monkeypatch.setattr(span_prefix, "hits_workload", lambda base, facts, hits, marks: "shared")
    monkeypatch.setattr(span_prefix, "span_placement", lambda *a, **k: ("replayed", 9))
    assert span_prefix.MIN_HITS == 25
    for read, kept in ((24, False), (25, True)):
        hits = [16] * read + [None] * 100
        monkeypatch.setattr(span_prefix, "span_hits", lambda *a, h=hits: h)
        out = span_prefix.pinned(object(), sync, object(), object(), object(), object(), run,
                                 7, False)
        assert out == (("shared", "replayed", 9, hits) if kept else (sync, run, 7, None))
