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
