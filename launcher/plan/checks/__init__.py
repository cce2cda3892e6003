"""Checks the plan makes before anything is written: the starting weights, MLPerf rules, observability settings."""
