"""Avalanche strategies, plugins and metrics for sequence models (``ovq_cl.base.avalanche_compat`` first)."""
