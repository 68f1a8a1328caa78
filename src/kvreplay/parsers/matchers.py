"""Fast per-kind matchers: the hot path. Text in, `(kind, fields)` out.

Each matcher is the regex twin of a start symbol in `messages.lark` (or of `envelope.lark`):
it returns the same ordered list of `(field, source text)` pairs that the Lark parse yields
(tests/unit/parsers/test_parse_grammar.py checks this on every grammar sample). The grammar is the
specification and the reference parser (`engine="lark"`); these regexes exist because a Lark
parse per line is ~50x slower than one compiled regex.

Dispatch is a dict lookup on the message's first word, so a line costs one envelope match,
one dict lookup and one message match. The most frequent shapes skip even that: parsers/fast.py
builds their events directly and falls back to these matchers whenever it is not sure.
"""

from __future__ import annotations

import re
from typing import Callable

Fields = list[tuple[str, str]]

# ------------------------------------------------------------------------- envelope

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# groups: wrapper_time, compose, wrapper_datetime, procs, level, date, time, source
ENVELOPE = re.compile(
    r"(?:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) +|([\w.-]+ +\|) +|\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] +)?"
    r"((?:\([A-Za-z][\w-]*(?: [\w=-]+)*? pid=\d+(?:, ip=[^)]+)?\) +)*)"
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) +(\d\d-\d\d) +(\d\d:\d\d:\d\d) +"
    r"\[?([^\s\[\]:]+\.py:\d+)(?:\]|\[\])(?: |$)"
)
# A record glued after other text (tqdm bar without newline, quoted in prose ...).
ENVELOPE_SEARCH = re.compile(
    r"(?:\([A-Za-z][\w-]*(?: [\w=-]+)*? pid=\d+(?:, ip=[^)]+)?\) +)*(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +\d\d-\d\d +\d\d:\d\d:\d\d +\[?[^\s\[\]:]+\.py:\d+(?:\]|\[\])"
)
# A vLLM message after another formatter's prefix (a serving framework's logger: its own time
# stamp, pid, logger name, level): the first words of a typed message kind (the dispatcher's
# table below), after a separator.
MESSAGE_SEARCH = re.compile(
    r"(?:^|(?<=[\s|\]:>-]))(?=Received request |Added request |Finished request |Aborted request|Avg prompt throughput: "
    r"|Engine \d{3}: |\d+ Engines Aggregated: |Sequence group \S+ is preempted|Running: \d+ reqs|Iteration\(\d+\): "
    r"|Generated response |GPU KV cache size: |# GPU blocks: |Maximum concurrency for |Available KV cache memory: "
    r"|Initializing an? (?:V[01] )?LLM engine|Chunked prefill is enabled|SpecDecoding metrics: |Speculative metrics: "
    r"|Prefix cache hit rate: GPU: |vllm cache_config_info |Overriding num_gpu_blocks=)"
)
PROC = re.compile(r"\(([A-Za-z][\w-]*(?: [\w=-]+)*?) pid=(\d+)(?:, ip=([^)]+))?\)")


def envelope_fields(line: str) -> Fields | None:
    """The envelope.lark field list for a line (used by the grammar equivalence tests)."""
    m = ENVELOPE.match(line)
    if m is None:
        return None
    out: Fields = []
    wt, comp, wdt, procs, level, date, time, source = m.groups()
    if wt:
        out.append(("wrapper_time", wt))
    if comp:
        out.append(("compose", comp))
    if wdt:
        out.append(("wrapper_datetime", wdt))
    for pm in PROC.finditer(procs or ""):
        out.append(("process", pm.group(1)))
        out.append(("pid", pm.group(2)))
    out += [("level", level), ("date", date), ("time", time), ("source", source)]
    msg = line[m.end():]
    if msg:
        out.append(("message", msg))
    return out


# ------------------------------------------------------------------------- messages

_F = r"(-?\d+(?:\.\d+)?|nan|inf)"
# quoted Python strings, unrolled (same matches as '(?:[^'\\]|\\.)*' but no alternation per character)
_STR = r"""'[^'\\]*+(?:\\.[^'\\]*+)*+'|"[^"\\]*+(?:\\.[^"\\]*+)*+\""""

_STATS_HEAD = re.compile(
    r"(?:Engine (?P<engine>\d+): |(?P<aggregated>\d+) Engines Aggregated: )?"
    rf"(?:Avg prompt throughput: (?P<prompt_throughput>{_F[1:-1]}) tokens/s, "
    rf"Avg generation throughput: (?P<generation_throughput>{_F[1:-1]}) tokens/s, )?"
    rf"(?:Max iteration time: (?P<max_iteration_ms>{_F[1:-1]}) ms, Avg time/tok: ?(?P<avg_time_per_token_ms>{_F[1:-1]}) ms, )?"
    r"Running: (?P<running>\d+) reqs"
)
_STATS_PART = re.compile(
    r"(?:, | )(?:"
    r"Waiting: (?P<waiting>\d+) reqs|Pending: (?P<pending>\d+) reqs|Swapped: (?P<swapped>\d+) reqs"
    r"|Deferred: (?P<deferred>\d+) reqs|Preemptions: (?P<preemptions>\d+)"
    r"|KV fetch: (?P<kv_fetch_waiting>\d+) waiting to start, (?P<kv_fetch_in_progress>\d+) in progress, (?P<kv_fetch_completed>\d+) completed waiting"
    rf"|(?P<kv_device>[A-Z][A-Za-z0-9]*(?: \+ [a-z]+)?) KV cache usage: (?P<kv_usage>{_F[1:-1]})%"
    rf"|Prefix cache hit rate: (?P<prefix_cache_hit_rate>{_F[1:-1]})%"
    rf"|External prefix cache hit rate: (?P<external_prefix_cache_hit_rate>{_F[1:-1]})%"
    rf"|MM cache hit rate: (?P<mm_cache_hit_rate>{_F[1:-1]})%"
    r"|Corrupted: (?P<corrupted>\d+) reqs)"
)


def _groups(m: re.Match) -> Fields:
    return [(k, v) for k, v in m.groupdict().items() if v is not None]


def match_stats(msg: str) -> Fields | None:
    m = _STATS_HEAD.match(msg)
    if m is None:
        return None
    out = _groups(m)
    pos = m.end()
    end = len(msg)
    if msg.endswith("."):
        end -= 1
    part = _STATS_PART.match
    while pos < end:
        pm = part(msg, pos, end)
        if pm is None:
            return None
        out += _groups(pm)
        pos = pm.end()
    return out


_SPEC_PART = re.compile(
    r"(?:Mean acceptance length: (?P<mean_acceptance_length>[\d.]+)"
    r"|Accepted throughput: (?P<accepted_throughput>[\d.]+) tokens/s"
    r"|Drafted throughput: (?P<drafted_throughput>[\d.]+) tokens/s"
    r"|Accepted: (?P<accepted>\d+) tokens|Drafted: (?P<drafted>\d+) tokens"
    r"|Per-position acceptance rate: (?P<per_position>\d+(?:\.\d+)?(?:, \d+(?:\.\d+)?)*)"
    r"|(?:Avg )?Draft acceptance rate: (?P<acceptance_rate>[\d.]+)%)(?:, |$)"
)


def _parts(rx: re.Pattern, msg: str) -> Fields | None:
    """Match `msg` as a sequence of `rx` parts (each consuming its separator)."""
    out: Fields = []
    pos, end = 0, len(msg)
    while pos < end:
        m = rx.match(msg, pos)
        if m is None or m.end() == pos:
            return None
        out += _groups(m)
        pos = m.end()
    return out if out else None


def _simple(pattern: str) -> Callable[[str], Fields | None]:
    rx = re.compile(pattern)

    def match(msg: str) -> Fields | None:
        m = rx.fullmatch(msg)
        return None if m is None else _groups(m)

    match.__name__ = f"match_{pattern[:20]}"
    match.rx = rx  # type: ignore[attr-defined]  # for the fused fast paths (parsers/fast.py)
    return match


MATCHERS: dict[str, Callable[[str], Fields | None]] = {
    "stats": match_stats,
    "prefix_cache_v0": _simple(rf"Prefix cache hit rate: GPU: (?P<gpu_hit_rate>{_F[1:-1]})%, CPU: (?P<cpu_hit_rate>{_F[1:-1]})%"),
    "preemption": _simple(
        r"Sequence group (?P<request_id>\S+) is preempted by PreemptionMode\.(?P<mode>[A-Z_]+) mode because there is not enough KV cache space\. "
        r"This can affect[^=]*?total_num_cumulative_preemption=(?P<cumulative>\d+)"
    ),
    "iteration": _simple(
        r"(?:Engine (?P<engine>\d+): )?Iteration\((?P<step>\d+)\): (?P<context_requests>\d+) context requests, (?P<context_tokens>\d+) context tokens, "
        r"(?P<generation_requests>\d+) generation requests, (?P<generation_tokens>\d+) generation tokens, "
        rf"iteration elapsed time: (?P<elapsed_ms>{_F[1:-1]}) ms(?: (?P<dummy>\(dummy\)))?"
        rf"(?:, (?P<kv_device>[A-Z][A-Za-z0-9]*(?: \+ [a-z]+)?) KV cache usage: (?P<kv_usage>{_F[1:-1]})%)?"
        r"(?:, encoder inputs: (?P<encoder_inputs>\d+), encoder output embeddings: (?P<encoder_output_embeddings>\d+))?"
    ),
    "received": _simple(
        rf"(?P<id>[^\s:]+): (?:prompt: (?P<prompt>{_STR}|None), )?(?:prefix_pos: [^,]*, ?)?"
        r"(?:params|sampling_params): (?P<params>\w+\((?:[^)\n]*+\))+?)"  # = \w+\(.*?\) by ")"-chunks
        r"(?:, prompt_token_ids: (?P<prompt_token_ids>\[[^\]]*\]|None))?"
        r"(?:, prompt_embeds shape: (?:None|torch\.Size\(\[[\d, ]*\]\)|\([\d, ]*\)))?"
        r", lora_request: (?P<lora>.*?)(?:, prompt_adapter_request: .*?)?\."
    ),
    "details": _simple(
        rf"(?P<details_id>\S+) details: prompt: (?P<prompt>{_STR}|None), prompt_token_ids: (?P<prompt_token_ids>\[[^\]]*\]|None)"
        r"(?:, prompt_embeds shape: (?:None|torch\.Size\(\[[\d, ]*\]\)|\([\d, ]*\)))?\."
    ),
    "body": _simple(r"(?P<body_id>\S+) JSON body: (?P<body>\{.*\})"),
    "added": _simple(r"(?P<dotted_id>\S+)\."),
    "aborted": _simple(r"(?P<ids>.+)\."),
    "finished": _simple(r"(?P<dotted_id>\S+)\."),
    "request_status": _simple(r"(?P<status_id>\S+) (?:(?P<aborted>aborted\.)|failed(?: \((?P<reason>[^)]+)\))?\.)"),
    "generated": _simple(
        r"(?P<gen_id>[^\s:]+)(?: (?P<streaming>\(streaming [a-z]+\)))?"
        r"(?: details: output_token_ids: (?P<output_token_ids_d>.*)"
        rf"|: output: (?P<output>{_STR}|None)(?:, output_token_ids: (?P<output_token_ids>\[[^\]]*\]|None))?, finish_reason: (?P<finish_reason>\S+))"
    ),
    "kv_size": _simple(
        r"(?P<device>[A-Z][A-Za-z0-9]*(?: \+ [a-z]+)?) KV cache size: (?P<tokens>\d{1,3}(?:,\d{3})+|\d+) tokens"
        r"(?:, Maximum concurrency for (?P<concurrency_tokens>\d{1,3}(?:,\d{3})+|\d+) tokens per request: "
        rf"(?P<max_concurrency>{_F[1:-1]})x)?"
    ),
    "kv_blocks": _simple(r"(?:# )?GPU blocks: (?P<num_gpu_blocks>\d+)(?:, # CPU blocks: (?P<num_cpu_blocks>\d+))?"),
    "kv_concurrency": _simple(
        rf"Maximum concurrency for (?P<concurrency_tokens>\d{{1,3}}(?:,\d{{3}})+|\d+) tokens per request: (?P<max_concurrency>{_F[1:-1]})x"
    ),
    "kv_cache_config": _simple(
        r"(?:Engine (?P<engine>\d+): |(?P<num_engines>\d+) Engines: )?vllm cache_config_info with initialization after num_gpu_blocks is: (?P<num_gpu_blocks>\d+)"
    ),
    "kv_override": _simple(
        r"Overriding num_gpu_blocks=(?P<num_gpu_blocks_profiled>\d+) with num_gpu_blocks_override=(?P<num_gpu_blocks_override>\d+)"
    ),
    "kv_memory": _simple(rf"Available KV cache memory: (?P<available_kv_gib>{_F[1:-1]}) GiB"),
    "init": _simple(
        r"Initializing (?:an|a (?P<engine_version>V[01])) LLM engine(?: \((?P<vllm_version>v[^\s)]+)\))? with config: (?P<config>.+)"
    ),
    "chunked": _simple(r"Chunked prefill is enabled (?:with max_num_batched_tokens=(?P<max_num_batched_tokens>\d+)\.|\(EXPERIMENTAL\)\.)"),
    "non_default_args": _simple(r"(?P<args>\{.*\})"),
    "namespace": _simple(r"(?P<namespace>Namespace\(.*\))"),
    "spec_v1": lambda msg: _parts(_SPEC_PART, msg),
    "spec_v0": _simple(
        r"Draft acceptance rate: (?P<acceptance_rate>[\d.]+|nan), System efficiency: (?P<system_efficiency>[\d.]+|nan), "
        r"Number of speculative tokens: \d+, Number of accepted tokens: (?P<accepted>\d+), "
        r"Number of draft tokens: (?P<drafted>\d+), Number of emitted tokens: (?P<emitted>\d+)\."
    ),
    "trace_config": _simple(r"kvtrace config (?P<trace_config>\S.*)"),
    "trace_request": _simple(
        r"kvtrace req (?P<handle>\d+) at=(?P<at>\d+) p=(?P<prompt_len>\d+) max=(?P<max_tokens>\d+) prio=(?P<priority>-?\d+) "
        r"id=(?P<req_id>\S+)(?: bh=(?P<block_hashes>[0-9a-f]+(?:,[0-9a-f]+)*))?"
    ),
    "trace_step": _simple(
        r"kvtrace step (?P<step>\d+)"
        r"(?: ab=(?P<aborted_before>\d+:\d+(?:,\d+:\d+)*))?"
        r"(?: s=(?P<sched>\d+(?::\d+)?(?:,\d+(?::\d+)?)*|-))?"
        r"(?: new=(?P<new>\d+:\d+(?:,\d+:\d+)*))?"
        r"(?: res=(?P<resumed>\d+:\d+(?:,\d+:\d+)*))?"
        r"(?: pre=(?P<preempted>[\d-]+/[\d-]+/\d+(?:,[\d-]+/[\d-]+/\d+)*))?"
        r"(?: abm=(?P<aborted_mid>\d+:\d+(?:,\d+:\d+)*))?"
        r"(?: u=(?P<updated>\d+|-|\?))?"
        r"(?: f=(?P<finished>\d+:\d+(?:,\d+:\d+)*))?"
        r"(?: bh=(?P<hashes>\d+:[0-9a-f]+(?:\.[0-9a-f]+)*(?:,\d+:[0-9a-f]+(?:\.[0-9a-f]+)*)*))?"
        r"(?: ev=(?P<kv_events>\d+))?"
        r" free=(?P<free>\d+) kv=(?P<kv_usage>-?\d+(?:\.\d+)?|nan|inf) q=(?P<running>\d+)/(?P<waiting>\d+)"
    ),
}

# Field renames so the fast path's names equal the grammar's (regex groups must be unique).
RENAME = {"output_token_ids_d": "output_token_ids"}


def dispatch(msg: str) -> tuple[str, str] | None:
    """Choose the start symbol for a message by its first words: (kind, text to parse).

    The returned text has the dispatch words removed (e.g. "Received request ").
    None means "no typed kind": the caller emits a Log event (or checks the error table).
    """
    sp = msg.find(" ")
    first = msg if sp < 0 else msg[:sp]
    f = _FIRST.get(first)
    if f is not None:
        return f(msg)
    if first[:1].isdigit():
        if "Engines Aggregated:" in msg:
            return "stats", msg
        if "cache_config_info" in msg:
            return "kv_cache_config", msg
        return None
    if first.startswith("Iteration("):
        return "iteration", msg
    if msg.startswith("KV cache size:", sp + 1) or " KV cache size: " in msg[:40]:
        return "kv_size", msg
    return None


_ENGINE_N = re.compile(r"Engine \d+: ").match


def _engine(msg: str) -> tuple[str, str] | None:
    if _ENGINE_N(msg) is None:  # "Engine background task failed", "Engine core ..." : not a stats line
        return None
    if msg.startswith("Iteration(", 12):
        return "iteration", msg
    if "cache_config_info" in msg:
        return "kv_cache_config", msg
    return "stats", msg


def _request(msg: str) -> tuple[str, str] | None:
    rest = msg[8:]
    if " JSON body: " in msg:
        return "body", rest
    if " details: " in msg:
        return "details", rest
    if msg.endswith(("aborted.", ").", "failed.")):
        return "request_status", rest
    return None


def _prefixed(prefix: str, kind: str, strip: bool = True) -> Callable[[str], tuple[str, str] | None]:
    n = len(prefix) if strip else 0

    def f(msg: str) -> tuple[str, str] | None:
        return (kind, msg[n:]) if msg.startswith(prefix) else None

    return f


def _aborted(msg: str) -> tuple[str, str] | None:
    if msg.startswith("Aborted request(s) "):
        return "aborted", msg[19:]
    if msg.startswith("Aborted request "):
        return "aborted", msg[16:]
    return None


def _gpu(msg: str) -> tuple[str, str] | None:
    if msg.startswith("GPU blocks:"):
        return "kv_blocks", msg
    if "KV cache size:" in msg[:40]:
        return "kv_size", msg
    return None


_FIRST: dict[str, Callable[[str], tuple[str, str] | None]] = {
    "Engine": _engine,
    "Avg": lambda m: ("stats", m),
    "Running:": lambda m: ("stats", m),
    "Prefix": _prefixed("Prefix cache hit rate: GPU:", "prefix_cache_v0", False),
    "Sequence": _prefixed("Sequence group ", "preemption", False),
    "Received": _prefixed("Received request ", "received"),
    "Request": _request,
    "Added": _prefixed("Added request ", "added"),
    "Aborted": _aborted,
    "Finished": _prefixed("Finished request ", "finished"),
    "Generated": _prefixed("Generated response ", "generated"),
    "GPU": _gpu,
    "#": lambda m: ("kv_blocks", m),
    "Maximum": _prefixed("Maximum concurrency for ", "kv_concurrency", False),
    "vllm": _prefixed("vllm cache_config_info", "kv_cache_config", False),
    "Overriding": _prefixed("Overriding num_gpu_blocks=", "kv_override", False),
    "Available": _prefixed("Available KV cache memory:", "kv_memory", False),
    "Initializing": lambda m: ("init", m) if " LLM engine" in m[:40] else None,
    "Chunked": _prefixed("Chunked prefill is enabled", "chunked", False),
    "non-default": _prefixed("non-default args: ", "non_default_args"),
    "args:": _prefixed("args: ", "namespace"),
    "SpecDecoding": _prefixed("SpecDecoding metrics: ", "spec_v1"),
    "Speculative": _prefixed("Speculative metrics: ", "spec_v0"),
    "kvtrace": lambda m: _kvtrace(m),
}

# kvreplay's step-trace plugin lines: "kvtrace step|req|config ..." (4 chars select the kind)
_TRACE_KINDS = {"step": "trace_step", "req ": "trace_request", "conf": "trace_config"}


def _kvtrace(msg: str) -> tuple[str, str] | None:
    kind = _TRACE_KINDS.get(msg[8:12])
    return None if kind is None else (kind, msg)


def match_message(kind: str, text: str) -> Fields | None:
    fields = MATCHERS[kind](text)
    if fields is not None and kind == "generated":
        fields = [(RENAME.get(k, k), v) for k, v in fields]
    return fields
