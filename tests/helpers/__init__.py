"""What tests share (never a test module: tests import these, not each other).

- tracecmp: load conformance cases and compare a kvreplay trace with vLLM's, field by field
- trace_read: read an exported Perfetto / Chrome trace back, independently of the exporter
- strategies: Hypothesis strategies (random conformance-format workloads)
- vllm_venv: find vLLM 0.33.0's venv (the `needs_vllm` tests) and run vllm_driver in it
- vllm_driver: a script run INSIDE that venv: vLLM's own scheduler with kvreplay's plugin

`tests/` is on the import path (pyproject's pytest `pythonpath`): `from helpers.tracecmp
import read_trace`.
"""
