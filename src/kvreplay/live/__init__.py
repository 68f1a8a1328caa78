"""Live replay: follow a growing vLLM log and decide each preemption as its evidence arrives.

* follow.py: the lines of a file as `tail -F` reads them (appended, rotated, truncated), or
  of stdin, in batches, without blocking longer than asked;
* session.py: the lines of one server run (a startup banner starts the next) replayed as
  they grow; each preemption (or, from stats lines only, each stats interval) is given
  once, when the lines that decide it have arrived;
* driver.py: the loop of both front ends (read, feed, replay when due, end the input).

No UI here: `kvreplay watch` (cli/watch.py) prints what a session decides, and
`kvreplay tui --follow` (tui/follow.py) shows each replay's timeline.
"""
