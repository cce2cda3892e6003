"""Host side: turns the resolved config into a plan, renders it into jobs and submits them. Imports no torch."""
