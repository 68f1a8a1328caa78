"""Developer tools (not part of the kvreplay package): tools/oracle (where the test data
comes from) and tools/research (how the figures in docs/accuracy.md were measured). Run
them from the repository root as modules: `python -m tools.oracle.oracle --check`."""
