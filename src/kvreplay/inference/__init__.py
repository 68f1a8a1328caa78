"""From what a vLLM log says to the run it does not show: the log inference.

    from kvreplay.inference import replay_log          # LogFacts -> Replay
    from kvreplay.inference.facts import collect       # events -> LogFacts

The stages (one module each, their docstrings say what each consumes and produces):
facts, formats, config, rebuild, engines, clock (+ lines, runs, fit), prompts (+ outputs),
placement, verify, confidence, assemble; driver.py chains them. step_trace.py replays a
log written with kvreplay's step-trace scheduler exactly. Only events and the model
(kvreplay.replay) come in: the inference never imports the parsers or a front end.
"""

from kvreplay.inference.driver import replay_facts, replay_log

__all__ = ["replay_log", "replay_facts"]
