"""The error a config that cannot run raises, from the plan and the checks made before anything is written."""

from __future__ import annotations


class PlanError(ValueError):
    """A config that cannot run. str() is one line per problem, each naming the keys and the fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))
