"""Plan, validate, render and submit Llama 3.1 pretraining jobs: `python main.py training=llama31/405b cluster=bcm`."""

import sys

from launcher.usage import HELP_FLAGS, config_dirs_of, missing_packages_line, usage

if __name__ == "__main__" and HELP_FLAGS & set(sys.argv[1:]):
    print(usage(config_dirs_of(sys.argv[1:])))  # before Hydra: its own --help composes every config group (seconds)
    sys.exit(0)
try:
    import hydra
    from omegaconf import DictConfig
except ImportError as err:  # outside the project's environment: one line, not a traceback
    print(missing_packages_line(err, sys.executable), file=sys.stderr)
    sys.exit(2)

from launcher.cli import one_line_errors, run_hydra_app, run_overrides, run_sweep  # noqa: E402
from launcher.config.schema import register  # noqa: E402
from launcher.config.sweep import is_sweep, uses_hydra_flags  # noqa: E402

register()


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    run_hydra_app(cfg)


if __name__ == "__main__":
    with one_line_errors():
        if is_sweep(sys.argv[1:]):
            sys.exit(run_sweep(sys.argv[1:]))
        if uses_hydra_flags(sys.argv[1:]):
            main()
        else:
            run_overrides(sys.argv[1:])
