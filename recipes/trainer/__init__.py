"""The training loop and its parts: building a run's trainer, the loop, the model's steps, their cadence, settings,
model, data, process groups, checkpoints, metrics, CUDA graphs."""
