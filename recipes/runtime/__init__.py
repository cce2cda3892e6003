"""What every room of the GPU side needs of the process it runs in, below all of them: which rank it is
(ranks.py), stop signals and the helper processes they must spare (stop_signals.py), agreement between ranks and
the model inside its data-parallel wrapper (distributed.py), and the protocol by which the training loop tells its
components what happens (callbacks.py). It imports nothing from the trainer, observability, resilience or
Hugging Face rooms."""
