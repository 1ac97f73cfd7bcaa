"""Avalanche strategies, plugins and metrics for sequence models. Import ``strategies.avalanche_compat`` first."""
