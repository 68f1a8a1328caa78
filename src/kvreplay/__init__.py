"""kvreplay: replay vLLM's scheduler from its logs and explain every preemption."""

__version__ = "0.1.0"
