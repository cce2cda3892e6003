"""cluster=sge (Grid Engine): golden job scripts for 8B, 70B and 405B (+ `bash -n`), data preparation and its
check, the image build, the -hold_jid chain, the one-line errors, and submission through stand-in qsub/qdel
commands (tests/sge/ submits to a real Grid Engine)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from launcher.cli import prepare
from launcher.plan.errors import PlanError

from launcher_helpers import check_golden, rendered, run_main

SIF = "/gpfs/containers/llama31+nemo+25.09.sif"


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("8b", ["training=llama31/8b"]),
        # LoRA renders as pretraining does: the same job, its own run directory; the base is another run's checkpoint.
        ("8b_lora", ["training=llama31/8b", "peft=lora", "training.checkpoint.init_from=/gpfs/runs/8b/iter_0010000"]),
        (
            "70b_fp8",
            [
                "training=llama31/70b",
                "dtype=fp8",
                "cluster.modules=[openmpi/5.0.2-gcc]",
                'cluster.qsub_args=["-g tga-llm"]',
                'cluster.setup=[". /etc/profile.d/modules.sh"]',
                "+cluster.env.NCCL_IB_SL=1",
            ],
        ),
        # 405B needs 8-GPU nodes for its TP8 layout (TSUBAME's 4-GPU nodes would take tp4_pp8_cp2_vp8_asym on GB200).
        (
            "405b",
            [
                "training=llama31/405b",
                "cluster.gpus_per_node=8",
                "cluster.gpu_type=h200",
                "cluster.node_resource=null",
                "cluster.parallel_environment=mpi",
                'cluster.resources=["gpu=8"]',
            ],
        ),
    ],
)
def test_training_job_scripts(cfg_for, tmp_path, name, overrides):
    scripts = rendered(cfg_for("cluster=sge", "dry_run=true", f"cluster.container={SIF}", *overrides))
    assert list(scripts) == ["submission.qsub"]
    text = scripts["submission.qsub"]
    check_golden(f"{name}_sge_submission.qsub", text, tmp_path)
    assert "trap 'exit 100' ERR" not in text  # nothing waits for training
    plan = prepare(cfg_for("cluster=sge", "dry_run=true", f"cluster.container={SIF}", *overrides)).plan
    assert f"mpirun -np {plan.num_gpus} -npernode {plan.gpus_per_node} \\" in text
    assert re.findall(r"-x (\w+) \\", text) == ["PYTHONPATH", "PATH", *plan.env, "MASTER_ADDR", "MASTER_PORT"]


def test_405b_parallel_environment_asks_one_slot_per_rank(cfg_for):
    text = rendered(
        cfg_for(
            "cluster=sge",
            "dry_run=true",
            f"cluster.container={SIF}",
            "training=llama31/405b",
            "cluster.gpus_per_node=8",
            "cluster.node_resource=null",
            "cluster.parallel_environment=mpi",
        )
    )["submission.qsub"]
    assert "#$ -pe mpi 1024\n" in text and "node_f" not in text


def test_data_preparation_and_its_check_hold_in_order(cfg_for, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("books", "web"):
        (corpus / f"{name}.jsonl").write_text('{"text": "x"}\n')
    cfg = cfg_for(
        "cluster=sge",
        "dry_run=true",
        f"cluster.container={SIF}",
        "stages=[data_preparation,training]",
        "data_preparation=files",
        f"data_preparation.inputs=[{corpus}/*.jsonl]",
        f"data_preparation.output_dir={tmp_path}/data",
        "data_preparation.job.max_parallel=1",
    )
    scripts = rendered(cfg)
    assert list(scripts) == ["data_preparation.qsub", "data_check.qsub", "submission.qsub"]
    for name in ("data_preparation.qsub", "data_check.qsub"):
        check_golden(f"files_sge_{name}", scripts[name], tmp_path)
        assert "\ntrap 'exit 100' ERR\n" in scripts[name]
    assert "#$ -t 1-2\n#$ -tc 1\n" in scripts["data_preparation.qsub"]
    assert '--shard "$((SGE_TASK_ID - 1))"' in scripts["data_preparation.qsub"]


def test_the_image_is_built_with_apptainer(cfg_for, tmp_path):
    prepared = prepare(
        cfg_for("cluster=sge", "dry_run=true", "stages=[container]", f"cluster.container={tmp_path}/images/llama31.sif")
    )
    (job,) = prepared.stages.jobs
    files = prepared.platform.render(job, prepared.cfg, prepared.run_dir)
    assert list(files) == ["container.qsub", "container.def"]
    check_golden("sge_container.qsub", files["container.qsub"], tmp_path)


def test_dry_run_prints_the_hold_jid_chain(tmp_path):
    out = run_main(
        "cluster=sge",
        "stages=[container,training]",
        f"cluster.container={tmp_path}/llama31.sif",
        "training=llama31/8b",
        "dry_run=true",
        f"results_dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    run_dir = tmp_path / "llama31_8b_bf16_tp1_cp2_8gpu"
    chain = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("JOB")]
    assert chain == [
        f"JOB1=$(qsub -terse {run_dir}/container.qsub | cut -d. -f1)",
        f"JOB2=$(qsub -terse -hold_jid $JOB1 {run_dir}/submission.qsub | cut -d. -f1)",
    ]
    assert "each job waiting for the previous one (-hold_jid)" in out.stdout


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["cluster.container_runtime=pyxis"],
            "cluster.container_runtime='pyxis': cluster=sge runs containers with apptainer or none",
        ),
        (
            ["training=llama31/8b", "cluster.node_resource=null"],
            "the training job needs 2 nodes but neither cluster.node_resource",
        ),
        (["cluster.time_limit=4h"], "cluster.time_limit='4h' is not a time limit"),
        (
            ["cluster.container=/gpfs/llama31.sqsh"],
            "is a .sqsh image but cluster.container_runtime=apptainer runs .sif",
        ),
    ],
)
def test_problems_name_their_keys(cfg_for, overrides, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        prepare(cfg_for("cluster=sge", "dry_run=true", f"cluster.container={SIF}", *overrides))


def test_submitting_needs_qsub(tmp_path):
    out = run_main(
        "cluster=sge", "cluster.container_runtime=none", f"results_dir={tmp_path}", env={"PATH": "/nonexistent"}
    )
    assert out.returncode == 2 and "cluster=sge submits with qsub" in out.stderr and "dry_run=true" in out.stderr


STAND_IN_QSUB = r"""#!/bin/bash
echo "qsub $*" >> "$TOOL_LOG"
n=$(grep -c '^qsub ' "$TOOL_LOG")
[ "$n" != "${FAIL_CALL:-0}" ] || { echo "Unable to run job: denied: host is not a submit host" >&2; exit 1; }
case "${@: -1}" in *data_preparation.qsub) echo "$((40 + n)).1-2:1" ;; *) echo "$((40 + n))" ;; esac
"""


def _stand_ins(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("qsub", STAND_IN_QSUB), ("qdel", '#!/bin/bash\necho "qdel $*" >> "$TOOL_LOG"\n')):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TOOL_LOG": str(tmp_path / "calls.log")}


def test_submission_chains_hold_jid_and_records_the_ids(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "y"}\n')
    env = _stand_ins(tmp_path)
    out = run_main(
        "cluster=sge",
        "cluster.container_runtime=none",
        "stages=[data_preparation]",
        "data_preparation=files",
        f"data_preparation.inputs=[{tmp_path}/*.jsonl]",
        f"data_preparation.output_dir={tmp_path}/data",
        f"results_dir={tmp_path}/results",
        env=env,
    )
    assert out.returncode == 0, out.stderr
    run_dir = tmp_path / "results" / "data_files_data"  # data preparation alone: its own run directory
    assert (tmp_path / "calls.log").read_text().splitlines() == [
        f"qsub -terse {run_dir}/data_preparation.qsub",
        f"qsub -terse -hold_jid 41 {run_dir}/data_check.qsub",
    ]
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert [(j["stage"], j["job_id"], j["dependency"]) for j in jobs] == [
        ("data_preparation", "41", None),
        ("data_check", "42", "hold_jid:41"),
    ]
    assert f"log {run_dir}/logs/data_preparation_41_*.out" in out.stdout and "qstat -j 41,42" in out.stdout


def test_a_failed_qsub_deletes_the_jobs_already_queued(tmp_path):
    env = {**_stand_ins(tmp_path), "FAIL_CALL": "2"}
    out = run_main(
        "cluster=sge",
        "stages=[container,training]",
        f"cluster.container={tmp_path}/img.sif",
        f"results_dir={tmp_path}/results",
        env=env,
    )
    assert out.returncode == 1
    assert "qsub submission.qsub failed: Unable to run job" in out.stderr and "deleted" in out.stderr
    assert (tmp_path / "calls.log").read_text().splitlines()[-1] == "qdel 41"
