"""What the checks find: problems (nothing is written while there is one) and warnings (printed, the run goes on).
Every check adds to one Findings, so a config with several problems gets all of them in one go."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Findings:
    dry_run: bool = False
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def problem(self, line: str) -> None:
        self.problems.append(line)

    def warning(self, line: str) -> None:
        self.warnings.append(line)

    def problem_unless_dry_run(self, line: str) -> None:
        """What a real run needs but a dry run (which writes the jobs for later) may lack, e.g. data not prepared
        yet."""
        if self.dry_run:
            self.warning(f"{line} (a real run stops here)")
        else:
            self.problem(line)
