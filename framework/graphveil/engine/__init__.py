"""The DP engine: per-tuple gradients, losses, noise, and one optimizer step (DESIGN.md, "One DP step")."""
