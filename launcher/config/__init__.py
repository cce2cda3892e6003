"""Composing the Hydra config into a plain dict, and the sweeps over it."""
