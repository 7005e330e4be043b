"""Uncertainty-gated LLM generation service (TAD)."""

__version__ = "0.1.0"
