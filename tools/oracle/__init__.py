"""vLLM's own scheduler and the generators that made the test data (README.md)."""
