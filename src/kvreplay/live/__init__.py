"""Live replay: follow a growing vLLM log and decide each preemption as its evidence arrives.

* follow.py: the lines of a file as `tail -F` reads them (appended, rotated, truncated), or
  of stdin, in batches, without blocking longer than asked;
* session.py: the lines of one server run (a startup banner starts the next) replayed as
  they grow; each preemption (or, from stats lines only, each stats interval) is given
  once, when the lines that decide it have arrived.

No UI here: the `kvreplay watch` command (cli/watch.py) prints what a session decides.
"""
