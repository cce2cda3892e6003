"""What the checks find: problems (nothing is written while there is one) and warnings (printed, the run goes on).
Every check adds to one Findings, so a config with several problems gets all of them in one go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from common.config import Config


class PlatformChecks(Protocol):
    """What the checks ask of the cluster's platform (launcher/platforms/base.py: Platform). The caller of validate
    passes it in: the platforms stand above the plan, which never imports them."""

    def stage_problems(self, cfg: Config, dry_run: bool) -> tuple[list[str], list[str]]:
        """(problems, warnings) of the selected stages on this platform."""
        ...

    def resilience_refusals(self, cfg: Config) -> list[str]:
        """One line for each resilience setting the platform cannot honour."""
        ...


@dataclass
class Findings:
    dry_run: bool = False
    platform: PlatformChecks | None = None  # None: no platform is checked (the auto-configurator's layouts)
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
