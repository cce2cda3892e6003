"""The training loop's parts: settings, model, data, distributed setup, checkpoints, metrics, stop signals."""
