"""conf/observability.yaml on the host side: defaults, the checks made before anything is written, the preflight
stage (order, chain, scripts) and the nsys wrapping of the profiled ranks in local and sbatch scripts."""

from __future__ import annotations

import re
import subprocess

import pytest

from common.typed import to_plain
from launcher.cli import prepare
from launcher.jobs.nsys import nsys_entry
from launcher.plan.errors import PlanError

from launcher_helpers import EIGHT_H100, NO_GPU, run_main
from test_render import SQSH, check_golden, rendered


def test_defaults(cfg_for):
    cfg = cfg_for()
    assert cfg.logging.tensorboard is True
    assert to_plain(cfg.logging.wandb) == {
        "enabled": False,
        "project": "llama31-recipes",
        "entity": None,
        "name": None,
        "mode": "auto",
    }
    assert cfg.profile.enabled is False and cfg.profile.tool == "torch"
    assert (cfg.profile.start_step, cfg.profile.end_step, cfg.profile.ranks) == (10, 12, [0])
    assert cfg.telemetry.enabled is True and cfg.telemetry.interval_s == 1.0
    assert cfg.preflight.min_busbw_gbps is None
    assert cfg.preflight.min_busbw_gbps_by_gpu_type["h100"] == 300
    assert cfg.stages == ["training"]  # the preflight runs only when asked for


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["profile.start_step=0"], "profile.start_step=0 must be positive: first profiled step"),
        (["profile.start_step=12", "profile.end_step=12"], "must satisfy 1 <= start_step < end_step"),
        (["profile.end_step=52"], "end_step <= training.train_steps + 1 = 51"),
        (["profile.ranks=[8]"], "profile.ranks=[8] must be a non-empty list of ranks in 0..7"),
        (["profile.ranks=[]"], "profile.ranks=[] must be a non-empty list"),
    ],
)
def test_profile_window_problems_name_their_keys(cfg_for, overrides, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        prepare(cfg_for("training=llama31/8b", "cluster=bcm", "dry_run=true", "profile.enabled=true", *overrides))


def test_a_disabled_profile_is_not_checked(cfg_for):
    prepare(cfg_for("training=llama31/8b", "cluster=bcm", "dry_run=true", "profile.ranks=[99]"))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["telemetry.interval_s=0"], "telemetry.interval_s=0.0 must be positive: seconds between samples"),
        (
            ["stages=[preflight,training]", "preflight.min_busbw_gbps=-1"],
            "preflight.min_busbw_gbps=-1.0 must be positive (or null)",
        ),
        (["stages=[preflight,training]", "preflight.sizes_mib=[1,0]"], "preflight.sizes_mib[1]=0.0 must be positive"),
        (["stages=[preflight,training]", "preflight.iterations=0"], "preflight.iterations=0 must be positive"),
        (["stages=[preflight,training]", "preflight.time_limit=1h"], "preflight.time_limit='1h' is not a Slurm time"),
    ],
)
def test_tracking_telemetry_and_preflight_problems(cfg_for, overrides, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        prepare(cfg_for("training=llama31/8b", "cluster=bcm", "dry_run=true", *overrides))


def test_nsys_missing_here_is_an_error_before_anything_runs_and_a_warning_in_a_dry_run(cfg_for, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys
    overrides = ["parallelism=tp1", "parallelism.num_gpus=2", "profile.enabled=true", "profile.tool=nsys"]
    with pytest.raises(
        PlanError, match="profile.tool=nsys needs Nsight Systems, but nsys is not on this machine's PATH"
    ):
        prepare(cfg_for(*overrides), EIGHT_H100)
    prepared = prepare(cfg_for(*overrides, "dry_run=true"), EIGHT_H100)
    assert any("nsys is not on this machine's PATH" in w for w in prepared.warnings)
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert not any("nsys" in w for w in prepare(cfg_for(*overrides), EIGHT_H100).warnings)


def test_main_py_says_where_nsys_is_missing(tmp_path):
    """What a user on a GPU machine without Nsight Systems sees (nothing is written or run)."""
    result = run_main(
        "profile.enabled=true",
        "profile.tool=nsys",
        f"results_dir={tmp_path}",
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "error: profile.tool=nsys needs Nsight Systems" in result.stderr
    assert not any(tmp_path.iterdir())


def test_nsys_wraps_only_the_chosen_ranks_on_this_machine(cfg_for, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    (tmp_path / "nsys").write_text("#!/bin/sh\n")
    (tmp_path / "nsys").chmod(0o755)
    scripts = rendered(
        cfg_for(
            "parallelism=tp1",
            "parallelism.num_gpus=2",
            "dry_run=true",
            "profile.enabled=true",
            "profile.tool=nsys",
            "profile.ranks=[1]",
        ),
        EIGHT_H100,
    )
    text = scripts["launch.sh"]
    assert "python -m torch.distributed.run --standalone --nproc-per-node 2 --no-python bash -c " in text
    assert "--capture-range=cudaProfilerApi --capture-range-end=stop" in text
    check_golden("tiny_local_nsys_launch.sh", text, tmp_path)


def test_nsys_in_the_sbatch_script(cfg_for, tmp_path):
    scripts = rendered(
        cfg_for(
            "training=llama31/70b",
            "cluster=bcm",
            "dry_run=true",
            f"cluster.container={SQSH}",
            "profile.enabled=true",
            "profile.tool=nsys",
            "profile.ranks=[0,8]",
            "profile.start_step=20",
            "profile.end_step=23",
        )
    )
    text = scripts["submission.sbatch"]
    assert '[[ " 0 8 " == *" $SLURM_PROCID "* ]]' in text
    check_golden("70b_bcm_nsys_submission.sbatch", text, tmp_path)


def test_the_rank_wrapper_runs_nsys_on_profiled_ranks_and_python_on_the_others(cfg_for, tmp_path, monkeypatch):
    """The rendered wrapper executed with stand-in nsys and python that record their arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nsys", "python"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls.txt\n')
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    prepared = prepare(
        cfg_for(
            "parallelism=tp1",
            "parallelism.num_gpus=2",
            "dry_run=true",
            "profile.enabled=true",
            "profile.tool=nsys",
            "profile.ranks=[1]",
        ),
        EIGHT_H100,
    )
    script = nsys_entry(prepared.cfg.profile, prepared.run_dir, ["python", "-m", "recipes.train"], "RANK")
    for rank in ("0", "1"):
        subprocess.run(script, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "RANK": rank}, check=True, timeout=30)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert calls[0] == "python -m recipes.train"
    assert calls[1].startswith("nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop")
    assert calls[1].endswith(f"--output={prepared.run_dir}/profile/nsys_rank1 python -m recipes.train")
    assert (prepared.run_dir / "profile").is_dir()
    # Without nsys on PATH the profiled rank stops with the reason; the others are unaffected.
    (bin_dir / "nsys").unlink()
    result = subprocess.run(
        script, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "RANK": "1"}, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1
    assert "profile.tool=nsys: nsys (Nsight Systems) is not on PATH" in result.stderr


# ----------------------------------------------------------------------------- the preflight stage
def test_preflight_runs_before_training_whatever_the_listing(cfg_for):
    prepared = prepare(
        cfg_for(
            "training=llama31/8b",
            "cluster=bcm",
            "dry_run=true",
            f"cluster.container={SQSH}",
            "stages=[training,preflight]",
        )
    )
    assert [j.stage for j in prepared.stages.jobs] == ["preflight", "training"]
    preflight, training = prepared.stages.jobs
    # The same shape as the training job, with its own (short) time limit.
    assert (preflight.nodes, preflight.ntasks_per_node, preflight.gpus_per_node) == (
        training.nodes,
        training.ntasks_per_node,
        training.gpus_per_node,
    )
    assert preflight.time_limit == "00:20:00" and preflight.env == training.env


def test_preflight_sbatch_script(cfg_for, tmp_path):
    scripts = rendered(
        cfg_for(
            "training=llama31/70b",
            "cluster=bcm",
            "dry_run=true",
            f"cluster.container={SQSH}",
            "stages=[preflight,training]",
        )
    )
    assert list(scripts) == ["preflight.sbatch", "submission.sbatch"]
    assert "--nodes=8" in scripts["preflight.sbatch"]
    check_golden("70b_bcm_preflight.sbatch", scripts["preflight.sbatch"], tmp_path)


def test_preflight_script_on_this_machine(cfg_for, tmp_path):
    scripts = rendered(
        cfg_for("parallelism=tp1", "parallelism.num_gpus=2", "dry_run=true", "stages=[preflight,training]"), EIGHT_H100
    )
    assert list(scripts) == ["preflight.sh", "launch.sh"]
    check_golden("tiny_local_preflight.sh", scripts["preflight.sh"], tmp_path)


def test_a_dry_run_prints_the_afterok_chain_with_the_preflight_first(tmp_path):
    result = run_main(
        "training=llama31/8b",
        "cluster=bcm",
        "dry_run=true",
        "stages=[preflight,training]",
        f"results_dir={tmp_path}",
        "cluster.container_runtime=none",
    )
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "llama31_8b_bf16_tp1_cp2_8gpu"
    assert f"JOB1=$(sbatch --parsable {run_dir}/preflight.sbatch)" in result.stdout
    assert f"JOB2=$(sbatch --parsable --dependency=afterok:$JOB1 {run_dir}/submission.sbatch)" in result.stdout


def test_without_a_gpu_here_neither_preflight_nor_training_runs(tmp_path):
    result = run_main("stages=[preflight,training]", f"results_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "did not train" in result.stdout and "==> preflight" not in result.stdout
    assert not (tmp_path / "llama31_tiny_bf16_tp1_1gpu" / "logs" / "preflight.log").exists()


def test_preflight_threshold_warnings(cfg_for):
    prepared = prepare(cfg_for("stages=[preflight,training]", "dry_run=true"), NO_GPU)
    assert any("no bandwidth threshold for GPU type unknown" in w for w in prepared.warnings)
    assert any("one GPU has no communication to measure" in w for w in prepared.warnings)
    prepared = prepare(
        cfg_for(
            "training=llama31/8b",
            "cluster=bcm",
            "dry_run=true",
            "cluster.container_runtime=none",
            "stages=[preflight,training]",
        )
    )
    assert not prepared.warnings
