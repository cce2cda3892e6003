"""parallelism=auto: the layout search, the step-time model that ranks layouts, and the measured runs it is fit to."""
