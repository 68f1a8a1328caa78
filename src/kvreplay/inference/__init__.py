"""From what a vLLM log says to the run it does not show: the log inference.

    from kvreplay.inference import infer, Evidence     # what a server left -> Replay
    from kvreplay.inference import replay_log          # LogFacts -> Replay (a log's stages)
    from kvreplay.inference.facts import collect       # events -> LogFacts

The stages (one module each, their docstrings say what each consumes and produces):
facts, formats, config, rebuild, engines, clock (+ lines, runs, fit), prompts (+ outputs),
placement, verify, confidence, assemble; driver.py chains them. step_trace.py replays a
log written with kvreplay's step-trace scheduler exactly. Only events and the model
(kvreplay.replay) come in: the inference never imports the parsers or a front end.
"""

from kvreplay.inference.driver import replay_facts, replay_log
from kvreplay.inference.entry import Evidence, infer

__all__ = ["infer", "Evidence", "replay_log", "replay_facts"]
