"""kvreplay.audit.fleet: `kvreplay audit` over many logs, on this machine or a Dask cluster,
into a Parquet dataset that a rerun completes and never doubles.

    from kvreplay.audit.fleet import Options, make_executor, run, summarize
    ex = make_executor("dask:tcp://scheduler:8786")     # or "local", "dask" (LocalCluster)
    try:
        fr = run(paths, ex, options=Options(), out_dir="audit/")
    finally:
        ex.close()
    summarize("audit/")                                 # the fleet tables (dict)

Modules: task.py (one input: its key, its rows or error row; runs on a worker),
executors.py (local processes, dask.distributed), run.py (the driver), dataset.py (the
folder of Parquet files), summarize.py (the fleet tables, a lazy polars scan).
`dask[distributed]` is the optional extra `kvreplay[fleet]`; only the dask executor needs it.
"""

from kvreplay.audit.fleet.executors import make_executor, parse_spec
from kvreplay.audit.fleet.run import FleetRun, run
from kvreplay.audit.fleet.summarize import summarize, summary_text
from kvreplay.audit.fleet.task import Options

__all__ = ["FleetRun", "Options", "make_executor", "parse_spec", "run", "summarize",
           "summary_text"]
