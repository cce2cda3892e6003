"""What a long run needs on the GPU side (docs/long-runs.md): ft_launcher as the job scripts start it (ft_launch),
the rank monitor that tells it which part of the run each rank is in (monitor), faults injected on purpose
(faults), NVRx's straggler reports (straggler), and the guard that the training loop asks about all of them and
that records the run's events (guard)."""
