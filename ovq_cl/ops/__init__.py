"""Functional sequence-mixing ops on [B, T, H, D] tensors: a PyTorch reference per op, fast paths beside."""
