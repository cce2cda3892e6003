"""data_preparation, when the stage is selected: its settings, sources and tokenizer (data_prep/checks.py), before
any job is written, on every platform and in dry runs."""

from __future__ import annotations

from common.config import Config, Stage
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    if Stage.data_preparation not in cfg.stages:
        return
    from data_prep.checks import preparation_problems  # loaded for this stage only: other runs do without it

    for line in preparation_problems(cfg.data_preparation):
        found.problem(line)
    if Stage.training in cfg.stages and cfg.training.data.mock:
        found.warning(
            "training.data.mock=true: training will not read the prepared data; set "
            "training.data.mock=false and training.data.blend to the prepared prefixes "
            "(python -m data_prep list --config RUN_DIR/config.yaml --prefixes)"
        )
