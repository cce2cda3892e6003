"""Plan, validate, render and submit Llama 3.1 pretraining jobs: `python main.py training=llama31/405b cluster=bcm`."""

import sys

import hydra
from omegaconf import DictConfig

from launcher.cli import one_line_errors, run, run_sweep
from launcher.config.schema import register
from launcher.config.sweep import is_sweep

register()


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    with one_line_errors():
        if is_sweep(sys.argv[1:]):
            sys.exit(run_sweep(sys.argv[1:]))
        main()
