"""Reports on finished runs: throughput, MLPerf scores, GPU telemetry, ranking against the step-time model, figures."""
