"""Host-safe code both sides share (the launcher and the recipes, data_prep too): no torch, no hydra at import."""
