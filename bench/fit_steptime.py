"""Fits the step-time model's free constants (launcher/autoconf/stepfit.py: FREE) to conf/perf/measured.yaml's `fit`
rows and prints, for today's constants (conf/parallelism/auto.yaml) and for the fitted ones, every row with its split,
measured and predicted step time and throughput and the error, then the mean and largest error on each split. No GPU.

    python bench/fit_steptime.py            # both tables, the constants side by side, the auto.yaml lines to paste
    python bench/fit_steptime.py --write    # also write the fitted constants into auto.yaml (comments kept), but
                                            # only where they are no worse than today's on the held-out rows
    python bench/fit_steptime.py --rows OUT/2gpu-*/measured_rows.yaml   # with rows not yet in measured.yaml

`--rows` adds rows printed by bench/autoconf_cases.py (each with the split it was given before it was measured; a row
of the same name as one of measured.yaml's replaces it), so new measurements join the fit and the held-out check
before they are pasted in. After the tables, every held-out row's error with today's and with the fitted constants.

The fitted constants are rounded to 3 significant digits before they are evaluated: the tables show what auto.yaml
would hold.
"""

from __future__ import annotations

import argparse
from pathlib import Path
import sys

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.autoconf import stepfit, steptime  # noqa: E402
from launcher.autoconf.perfdata import MEASURED, measured_rows, rows_from_files  # noqa: E402
from launcher.config.compose import CONF_DIR  # noqa: E402

AUTO_YAML = CONF_DIR / "parallelism" / "auto.yaml"


def held_out_no_worse(today: list[steptime.Check], fitted: list[steptime.Check]) -> bool:
    """The fitted constants are no worse on the held-out rows: neither their mean nor their largest error grew."""
    (before,) = [e for e in steptime.split_errors(today) if e.split == "held_out"]
    (after,) = [e for e in steptime.split_errors(fitted) if e.split == "held_out"]
    return after.mean <= before.mean and after.largest <= before.largest


def all_rows(extra: list[str]) -> list[dict]:
    """measured.yaml's rows, then those of the --rows files; a file's row replaces measured.yaml's of the same name."""
    try:
        added = rows_from_files(extra)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    latest = {row["name"]: row for row in added}  # a row in several files (a shard run again) counts once
    return [row for row in measured_rows() if row["name"] not in latest] + list(latest.values())


def format_held_out(today: list[steptime.Check], fitted: list[steptime.Check]) -> str:
    """Each held-out row: measured step time, the prediction and its error with today's and the fitted constants."""
    pairs = [(a, b) for a, b in zip(today, fitted) if a.split == "held_out"]
    w = max([20] + [len(a.name) for a, _ in pairs])
    lines = [f"{'held-out row':<{w}} {'step s':>7} {'today':>7} {'error':>7} {'fitted':>7} {'error':>7}"]
    for a, b in pairs:
        lines.append(
            f"{a.name:<{w}} {a.measured_step_s:>7.3f} {a.predicted.total_s:>7.3f} {a.error * 100:>+6.1f}% "
            f"{b.predicted.total_s:>7.3f} {b.error * 100:>+6.1f}%"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the fitted constants into auto.yaml if no worse")
    parser.add_argument("--rows", nargs="+", default=[], help="files of measured rows to add (autoconf_cases.py's)")
    args = parser.parse_args(argv)

    today = steptime.default_constants()
    checks = steptime.check_rows(today, all_rows(args.rows))
    fitted = stepfit.rounded(stepfit.fit_constants([c for c in checks if c.split == "fit"], today))
    refit = [c.again(fitted) for c in checks]

    source = MEASURED.relative_to(REPO)
    added = f" and {', '.join(args.rows)}" if args.rows else ""
    print(f"step-time constants fit to the `fit` rows of {source}{added} (least squares on log step time)\n")
    print(f"today's constants ({AUTO_YAML.relative_to(REPO)})")
    print(steptime.format_checks(checks))
    print("\nfitted constants")
    print(steptime.format_checks(refit))
    print("\nthe held-out rows, step time measured and predicted, error in tokens/s/GPU as in the tables above")
    print(format_held_out(checks, refit))
    print(f"\n{'constant':<28} {'today':>10} {'fitted':>10}")
    for path in stepfit.FREE:
        print(f"{path:<28} {stepfit.constant(today, path):>10.4g} {stepfit.constant(fitted, path):>10.4g}")

    text = AUTO_YAML.read_text()
    values = {path: stepfit.constant(fitted, path) for path in stepfit.FREE}
    new_text = stepfit.yaml_with_constants(text, values)
    changed = [line for line in new_text.splitlines() if line not in text.splitlines()]
    print("\nauto.yaml's step_time lines with the fitted constants:")
    print("\n".join(changed) if changed else "(none changes)")

    better = held_out_no_worse(checks, refit)
    print(
        "\nthe fitted constants are "
        + ("no worse than today's on the held-out rows" if better else "worse than today's on the held-out rows")
    )
    if args.write:
        if better:
            AUTO_YAML.write_text(new_text)
            print(f"wrote them into {AUTO_YAML.relative_to(REPO)}")
        else:
            print(f"kept today's constants in {AUTO_YAML.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
