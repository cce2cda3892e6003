"""Platforms: where the stage jobs run. A platform is a `cluster` config (its `platform` key picks one in
registry.py) plus a subclass of launcher/platforms/base.py's Platform, one per module named after it, that lays out,
renders and submits the same stage jobs; the plan and the stage commands (launcher/jobs/commands.py) are shared by
all of them, and neither imports this package: the caller hands them the platform."""
