"""The plan: every size a job needs, derived from the resolved config and validated before anything is written."""
