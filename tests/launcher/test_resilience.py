"""conf/resilience/ on the launcher's side: the jobs with ft_launcher and with a chain of jobs (golden files),
the platforms' one-line refusals, the checks of every value, and the chain's decision (common/job_chain.py)
from a run's events. The jobs' behaviour on real schedulers: tests/slurm/test_slurm_chain.py and
tests/sge/test_sge_chain.py; on GPUs: tests/recipes/test_gpu_resilience.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from common import job_chain, run_events
from common.checkpoints import TrainState, finalize_checkpoint, partial_path
from launcher.cli import prepare
from launcher.plan.errors import PlanError

from launcher_helpers import ONE_H100, REPO, check_golden, rendered

SQSH = "/shared/containers/nvidia+nemo+25.09.sqsh"
SIF = "/gpfs/containers/llama31+nemo+25.09.sif"
IMAGE = "nvcr.io/myorg/llama31-recipes:25.09"
BOTH = ["resilience.job_restarts=3", "resilience.in_job_restarts=2", "training.checkpoint.interval=100"]


def problems(cfg) -> list[str]:
    with pytest.raises(PlanError) as err:
        prepare(cfg)
    return err.value.problems


# ----------------------------------------------------------------------------- the rendered jobs
def test_slurm_runs_ft_launcher_on_every_node_in_a_chain_of_jobs(cfg_for, tmp_path):
    scripts = rendered(
        cfg_for("training=llama31/70b", "cluster=bcm", "dry_run=true", f"cluster.container={SQSH}", *BOTH)
    )
    text = scripts["submission.sbatch"]
    check_golden("70b_bcm_resilience_submission.sbatch", text, tmp_path)
    # One task per node (its ft_launcher), every GPU of the node for its ranks, the rendezvous on the first node.
    assert "#SBATCH --nodes=8\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8" in text
    assert "--nnodes 8 --nproc-per-node 8" in text and '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in text
    assert "--max-restarts 2" in text and "--mpi=" not in text
    assert (
        text.index("common.job_chain begin")
        < text.index("recipes.resilience.ft_launch")
        < text.index("common.job_chain end")
        < text.index("launcher.report")
    )


def test_the_chain_is_submitted_up_front_each_job_after_the_one_before_ends(cfg_for, tmp_path):
    prepared = prepare(
        cfg_for(
            "cluster=bcm",
            "dry_run=true",
            f"cluster.container={SQSH}",
            "stages=[preflight,training]",
            "resilience.job_restarts=2",
            "parallelism.num_gpus=2",
            "cluster.gpus_per_node=2",
        )
    )
    lines = prepared.platform.chain_as_shell(prepared.stages.jobs, prepared.run_dir, prepared.cfg)
    deps = [re.search(r"--dependency=(\S+)", line).group(1) if "--dependency" in line else None for line in lines]
    assert deps == [None, "afterok:$JOB1", "afterany:$JOB2", "afterany:$JOB3"]
    assert [line.split()[-1].rsplit("/", 1)[-1].rstrip(")") for line in lines] == [
        "preflight.sbatch",
        "submission.sbatch",
        "submission.sbatch",
        "submission.sbatch",
    ]


def test_grid_engine_runs_ft_launcher_per_node_in_a_chain(cfg_for, tmp_path):
    scripts = rendered(cfg_for("training=llama31/8b", "cluster=sge", "dry_run=true", f"cluster.container={SIF}", *BOTH))
    text = scripts["submission.qsub"]
    check_golden("8b_sge_resilience_submission.qsub", text, tmp_path)
    assert "mpirun -np 2 -npernode 1" in text and "--nnodes 2 --nproc-per-node 4" in text
    assert "trap 'exit 100' ERR" not in text  # a failed job must not keep the next one of the chain from starting


def test_kubernetes_runs_ft_launcher_in_every_pod_and_refuses_a_chain(cfg_for, tmp_path):
    k8s = [
        "cluster=k8s",
        "dry_run=true",
        f"cluster.container={IMAGE}",
        "cluster.namespace=llm",
        f"cluster.volumes=[{{claim: code, mount: {REPO}}},{{claim: runs, mount: {tmp_path}}}]",
    ]
    scripts = rendered(
        cfg_for(*k8s, "training=llama31/70b", "resilience.in_job_restarts=2", "training.checkpoint.interval=100")
    )
    check_golden("70b_k8s_resilience_submission.yaml", scripts["submission.yaml"], tmp_path, shell=False)
    (_, job) = [d for d in yaml.safe_load_all(scripts["submission.yaml"]) if d]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "recipes.resilience.ft_launch" in command and "--rdzv-backend c10d" in command
    assert problems(cfg_for(*k8s, "resilience.job_restarts=2")) == [
        "resilience.job_restarts=2: cluster=k8s has no jobs that wait for the one before them to end however it "
        "ended (a Job cannot wait for another to end; create the run again to continue it from its newest "
        "checkpoint, or let resilience.in_job_restarts restart the ranks inside the pods; set "
        "resilience.job_restarts=0)"
    ]


def test_base_command_refuses_both_in_one_line_each(cfg_for, tmp_path):
    bcp = [
        "cluster=bcp",
        "dry_run=true",
        f"cluster.container={IMAGE}",
        "cluster.ace=nv-us-east-2",
        f"cluster.workspaces=[{{id: code, mount: {REPO}}},{{id: runs, mount: {tmp_path}}}]",
    ]
    assert problems(cfg_for(*bcp, "resilience.job_restarts=1", "resilience.in_job_restarts=1")) == [
        "resilience.job_restarts=1: cluster=bcp has no jobs that wait for the one before them to end however it "
        "ended (a job cannot wait for another to end; submit the run again to continue it from its newest "
        "checkpoint, and set resilience.job_restarts=0)",
        "resilience.in_job_restarts=1: cluster=bcp cannot start the ranks under ft_launcher yet (bcprun starts "
        "every rank itself, one process per GPU); set resilience.in_job_restarts=0",
    ]


def test_this_machine_runs_ft_launcher_standalone(cfg_for, tmp_path):
    scripts = rendered(
        cfg_for("dry_run=true", "resilience.in_job_restarts=2", "resilience.hang_timeout_s=60"), ONE_H100
    )
    check_golden("tiny_local_resilience_launch.sh", scripts["launch.sh"], tmp_path)
    assert "--standalone --nnodes 1 --nproc-per-node 1" in scripts["launch.sh"]
    assert "step:60," in scripts["launch.sh"]


def test_nothing_changes_while_resilience_is_off(cfg_for, tmp_path):
    for name, overrides in (
        ("405b_bf16_bcm_submission.sbatch", ["training=llama31/405b", "cluster=bcm"]),
        ("8b_sge_submission.qsub", ["training=llama31/8b", "cluster=sge"]),
    ):
        container = SQSH if "bcm" in name else SIF
        text = next(
            iter(
                rendered(
                    cfg_for(
                        *overrides, "dry_run=true", f"cluster.container={container}", "resilience.hang_timeout_s=60"
                    )
                ).values()
            )
        )
        check_golden(name, text, tmp_path)  # a timeout alone, without restarts, renders the same job


# ----------------------------------------------------------------------------- checks
@pytest.mark.parametrize(
    "overrides,line",
    [
        (
            ["resilience.job_restarts=-1"],
            "resilience.job_restarts=-1 must be at least 0: more jobs queued after the first, each continuing from "
            "the newest checkpoint after a time limit or a failure (Slurm, Grid Engine)",
        ),
        (
            ["resilience.hang_timeout_s=5"],
            "resilience.hang_timeout_s=5.0 must be at least 10 (seconds; ft_launcher looks at the ranks every 5 s): "
            "a rank silent this long in a step (or between steps) is hung: every rank restarts",
        ),
        (
            ["resilience.straggler_detection.threshold=1.5"],
            "resilience.straggler_detection.threshold=1.5 must be in (0, 1]: name the GPUs below this share of the "
            "fastest one's speed",
        ),
        (
            ["resilience.inject_fault.kind=crash", "resilience.inject_fault.rank=8"],
            "resilience.inject_fault.rank=8 is not a rank of this job: use 0..7",
        ),
        (
            [
                "resilience.inject_fault.kind=kill",
                "resilience.inject_fault.during=save",
                "resilience.inject_fault.step=30",
                "training.checkpoint.interval=20",
            ],
            "resilience.inject_fault.during=save at step 30, which saves no checkpoint "
            "(training.checkpoint.interval=20): pick a multiple of the interval",
        ),
        (
            ["resilience.job_restarts=2", "training.checkpoint.load=false"],
            "resilience.job_restarts=2 continues from the "
            "newest checkpoint, but training.checkpoint.load=false starts every job or restart from scratch: set "
            "training.checkpoint.load=true",
        ),
        (
            ["resilience.job_restarts=2", "stages=[training,export]"],
            "stages has export and resilience.job_restarts=2: "
            "the export would wait on a chain of training jobs that ends early once training finished; drop export "
            "from stages and run stages=[export] with the same run_name when training finished",
        ),
        (
            [
                "resilience.straggler_detection.enabled=true",
                "resilience.straggler_detection.interval_steps=10",
                "training.log_interval=4",
            ],
            "resilience.straggler_detection.interval_steps=10 must be a multiple of "
            "training.log_interval=4 (each report goes into that step's metrics.jsonl record)",
        ),
    ],
)
def test_bad_values_are_one_line_naming_the_key(cfg_for, overrides, line):
    found = problems(
        cfg_for("training=llama31/8b", "cluster=bcm", "dry_run=true", f"cluster.container={SQSH}", *overrides)
    )
    assert line in found, found


# ----------------------------------------------------------------------------- the chain's decision
def complete(run_dir: Path, step: int) -> None:
    root = run_dir / "checkpoints"
    partial = Path(partial_path(str(root), step, "test"))
    partial.mkdir(parents=True)
    finalize_checkpoint(str(root), TrainState(step, step * 8), str(partial))


def test_the_chain_trains_while_jobs_save_and_stops_after_two_jobs_without_progress(tmp_path):
    run = str(tmp_path)
    run_events.record(run, "chain", jobs=5)
    assert job_chain.begin(run, "101").code == job_chain.TRAIN  # nothing yet: train
    assert job_chain.begin(run, "102").code == job_chain.TRAIN  # 101 saved nothing: one retry
    complete(tmp_path, 40)
    assert job_chain.begin(run, "103").code == job_chain.TRAIN  # 102 saved: go on
    assert job_chain.begin(run, "104").code == job_chain.TRAIN  # 103 saved nothing: one retry
    decision = job_chain.begin(run, "105")  # 104 neither: stop
    assert decision.code == job_chain.STOP
    assert decision.line == (
        "chain: stopped: jobs 103 and 104 both ended without a new checkpoint (the newest is "
        "still iter_0000040), so the same failure would repeat; job 105 (5 of 5) does not train: "
        "fix what their logs show and submit the run again"
    )
    assert [e["decision"] for e in run_events.read(run) if e["event"] == "job"] == ["train"] * 4 + ["stop"]


def test_a_finished_or_diverged_run_ends_the_chain(tmp_path):
    run = str(tmp_path)
    run_events.record(run, "chain", jobs=3)
    assert job_chain.begin(run, "7").code == job_chain.TRAIN
    run_events.record(run, "start", resumed_step=0)
    run_events.record(run, "end", step=200, finished=True)
    assert job_chain.end(run, "7").code == job_chain.FINISHED
    decision = job_chain.begin(run, "8")
    assert decision.code == job_chain.FINISHED and "training finished at step 200" in decision.line
    run_events.record(run, "start", resumed_step=0)
    run_events.record(run, "end", step=12, finished=False, reason="diverged: loss=nan")
    decision = job_chain.begin(run, "9")
    assert decision.code == job_chain.STOP and "(diverged: loss=nan)" in decision.line
    assert job_chain.main(["begin", "--run-dir", run, "--job-id", "10"]) == job_chain.STOP


def test_the_last_job_of_an_unfinished_chain_says_how_to_go_on(tmp_path):
    run = str(tmp_path)
    run_events.record(run, "chain", jobs=2)
    job_chain.begin(run, "1")
    assert job_chain.end(run, "1").line == ""
    job_chain.begin(run, "2")
    assert "was the last of the chain's 2 jobs and training is not finished" in job_chain.end(run, "2").line
