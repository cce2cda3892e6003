"""The training loop and its parts: the loop, its cadence, settings, model, data, ranks and process groups,
checkpoints, metrics, stop signals."""
