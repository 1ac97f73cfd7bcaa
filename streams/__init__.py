"""Seeded, pure generators of episodes, and their Avalanche benchmarks. Nothing here knows of models."""
