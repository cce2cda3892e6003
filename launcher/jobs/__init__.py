"""From a plan to jobs: the stage commands, the stages, rendering, the run directory and submission."""
