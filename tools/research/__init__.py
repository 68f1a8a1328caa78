"""Calibration, evaluation and ceilings behind docs/accuracy.md (README.md)."""
