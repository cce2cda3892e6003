"""`python -m launcher.report --rank`: measured runs fastest first, beside the step-time model's prediction and rank,
and how many pairs the model ordered as measured."""

from __future__ import annotations

import json
import re
import pytest

from common.run import load_run
from launcher.autoconf import steptime
from launcher.cli import prepare
from launcher.config.compose import compose
from launcher.jobs.rundir import write_run_dir
from launcher.report import ranking
from launcher.report.__main__ import main as report_main

LAYOUTS = {"dp4": ["parallelism=tp1"], "cp2": ["parallelism=tp1_cp2"], "tp2": ["parallelism=tp2_sp"]}


def _runs(tmp_path, step_times: dict[str, float]):
    """Run directories of 8B on 4 H200 as main.py writes them, with a metrics.jsonl of the given step times."""
    dirs = {}
    for name, overrides in LAYOUTS.items():
        cfg = compose(
            [
                "training=llama31/8b",
                *overrides,
                "parallelism.num_gpus=4",
                "cluster=bcm",
                "cluster.gpu_type=h200",
                "cluster.gpus_per_node=4",
                "training.global_batch_size=32",
                f"results_dir={tmp_path}",
                f"run_name={name}",
                "dry_run=true",
            ]
        )
        prepared = prepare(cfg)
        write_run_dir(prepared.run_dir, prepared.cfg, prepared.plan, prepared.stages.jobs, prepared.platform)
        (prepared.run_dir / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": i + 1, "loss": 9.0, "step_time_s": step_times[name]}) + "\n" for i in range(10))
        )
        dirs[name] = prepared.run_dir
    return dirs


def _model_order(dirs) -> list[str]:
    return sorted(dirs, key=lambda name: ranking.predicted_step_s(dirs[name]))


def _rank(dirs, capsys):
    code = report_main(["--rank", *map(str, dirs.values()), "--plot", str(next(iter(dirs.values())).parent / "r.png")])
    stdout = capsys.readouterr().out
    assert code == 0
    table = stdout[stdout.index("model rank") :]
    rows = [line.split() for line in table.splitlines()[1:] if re.match(r"\s*\d+\s", line)]
    return stdout, rows


def test_runs_are_ranked_fastest_first_beside_the_prediction(tmp_path, capsys):
    probe = _runs(tmp_path / "probe", {name: 1.0 for name in LAYOUTS})
    order = _model_order(probe)  # the model's order of the three layouts
    measured = {name: 5.0 + i for i, name in enumerate(order)}  # measured in the model's order
    dirs = _runs(tmp_path / "runs", measured)
    stdout, rows = _rank(dirs, capsys)
    assert [row[1] for row in rows] == order
    for row in rows:
        run = load_run(dirs[row[1]])
        assert float(row[-2]) == pytest.approx(
            steptime.predict(run.config, run.plan, steptime.default_constants()).total_s, abs=0.0005
        )
        assert row[-1] == row[0]  # predicted rank = measured rank
    assert "3 of 3 pairs alike, Spearman +1.00" in stdout


def test_a_reversed_order_shows_as_disagreement(tmp_path, capsys):
    probe = _runs(tmp_path / "probe", {name: 1.0 for name in LAYOUTS})
    order = _model_order(probe)
    dirs = _runs(tmp_path / "runs", {name: 7.0 - i for i, name in enumerate(order)})
    stdout, rows = _rank(dirs, capsys)
    assert [row[1] for row in rows] == order[::-1]
    assert "0 of 3 pairs alike, Spearman -1.00" in stdout


def test_pairs_and_spearman():
    assert ranking.concordant_pairs([1, 2, 3, 4], [1, 3, 2, 4]) == (5, 6)
    assert ranking.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert ranking.spearman([1, 2], [2, 1]) is None
