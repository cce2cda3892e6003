"""Watching a run: tracking, profiling, GPU telemetry, MLPerf logging, and the network preflight."""
