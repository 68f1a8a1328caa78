"""Speed and memory benchmarks (ratios to a baseline measured in the same run). Run from the
repository root as modules: `python -m bench.bench_replay`."""
