"""The exact commands each stage runs, and the srun/pyxis flags around them. Strings only: rendering puts them
into scripts, the plan records the training one."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from common.checkpoints import TRACKER
from common.config import CheckpointConfig, Config, ContainerCluster, LocalCluster, SlurmCluster
from common.typed import to_plain

REPO = Path(__file__).resolve().parents[2]


def python_bin_dir() -> str:
    """Where the Python running main.py lives (a virtualenv's bin/): local and bare-metal jobs put it first on
    PATH so `python` in the job is the one that planned it."""
    return str(Path(sys.executable).parent)


def bare_path(cluster: LocalCluster | ContainerCluster) -> str | None:
    """The bin directory a job puts first on PATH: local and bare-metal jobs run with the Python that runs main.py,
    container jobs with the image's (None)."""
    return None if in_container(cluster) else python_bin_dir()


def in_container(cluster: LocalCluster | ContainerCluster) -> bool:
    """Cluster jobs run in cluster.container unless it is null or cluster.container_runtime=none; jobs on this
    machine run with the Python that runs main.py."""
    return not cluster.runs_here and bool(cluster.container) and cluster.container_runtime != "none"


def shell_line(prefix: list[str], command: str, container: Sequence[str] = ()) -> str:
    """`prefix [container] command` with one flag per line when long, so a rendered script reads (and diffs) flag
    by flag; `container` (e.g. `apptainer exec ... image.sif`) starts its own line; `command` is shell text."""
    text = shlex.join([*prefix, *container])
    if len(text) <= 40:
        return f"{text} {command}"
    parts = [shlex.quote(a) for a in prefix]
    if container:
        parts += [shlex.join(container[:2])] + [shlex.quote(a) for a in container[2:]]
    return " \\\n    ".join(parts + [command])


def grouped_line(groups: Sequence[Sequence[str]], command: str) -> str:
    """`group group ... command`, one group per line (a flag with its value, `apptainer exec`), for launchers
    whose flags take separate values (mpirun -x NAME)."""
    parts = [shlex.join(g) for g in groups if g]
    return " \\\n    ".join(parts + [command])


# --------------------------------------------------------------------------- what runs
def training_entry(run_dir: Path) -> list[str]:
    """The training entry every rank runs; it reads config.yaml and plan.json from the run directory."""
    return ["python", "-m", "recipes.train", "--run-dir", str(run_dir)]


def preflight_entry(run_dir: Path) -> list[str]:
    """The network preflight every rank of the training job's shape runs (recipes/observability/preflight.py)."""
    return ["python", "-m", "recipes.preflight", "--run-dir", str(run_dir)]


def torchrun_command(num_gpus: int, run_dir: Path, entry: list[str] | None = None) -> list[str]:
    """torchrun over this machine's GPUs for an entry (default: training): `python -m ...`, or any other program
    (e.g. the nsys wrapper), which torchrun then starts with --no-python. It starts through the job's `python`
    (a virtualenv over a system's packages has no torchrun script of its own). --standalone: a rendezvous on a
    free local port, so two local runs never collide."""
    entry = entry or training_entry(run_dir)
    program = entry[1:] if entry[0] == "python" else ["--no-python", *entry]
    return ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(num_gpus), *program]


# --------------------------------------------------------------------------- long runs (resilience)
FT_LAUNCH = ["python", "-m", "recipes.resilience.ft_launch"]


def ft_launch_command(
    cfg: Config,
    run_dir: Path,
    entry: list[str],
    nnodes: int,
    nproc: int,
    rendezvous: tuple[str, str] | None = None,
) -> str:
    """nvidia-resiliency-ext's ft_launcher (torchrun with a rank monitor per rank) in place of torchrun, one per
    node, as shell text. `rendezvous` is (endpoint, id), shell words that may hold variables ("$MASTER_ADDR:..."),
    or None for one node on a free local port (--standalone). Hang detection works by sections
    (recipes/resilience/monitor.py): a rank's start up to the end of its first step, every later step, each
    checkpoint save, and the time outside them, each with its timeout, so neither the warm-up nor a save is taken
    for a hang. Its own progress check reads the checkpoint tracker: two restarts in a row without a new
    checkpoint end the job, as two such jobs end a chain (common/job_chain.py)."""
    res = cfg.resilience
    sections = f"setup:{res.startup_timeout_s:g},step:{res.hang_timeout_s:g},checkpointing:{res.checkpoint_timeout_s:g}"
    program = entry[1:] if entry[0] == "python" else ["--no-python", *entry]
    groups = [
        shlex.join(
            [
                *FT_LAUNCH,
                *(["--standalone"] if rendezvous is None else []),
                "--nnodes",
                str(nnodes),
                "--nproc-per-node",
                str(nproc),
            ]
        )
    ]
    if rendezvous is not None:
        groups += ["--rdzv-backend c10d", f'--rdzv-endpoint "{rendezvous[0]}"', f'--rdzv-id "{rendezvous[1]}"']
    groups += [
        shlex.join(pair)
        for pair in (
            ["--max-restarts", str(res.in_job_restarts)],
            ["--ft-rank-section-timeouts", sections],
            ["--ft-rank-out-of-section-timeout", f"{res.hang_timeout_s:g}"],
            ["--ft-checkpoint-iteration-file", str(run_dir / "checkpoints" / TRACKER)],
            ["--ft-max-no-progress-cycles", "2"],
        )
    ]
    return " \\\n    ".join([*groups, shlex.join(program)])


def job_chain_command(run_dir: Path, when: str, job_id: str) -> str:
    """The chain's question before (begin) and after (end) a job trains (common/job_chain.py); `job_id` is shell
    text (the scheduler's variable)."""
    return f'python -m common.job_chain {when} --run-dir {shlex.quote(str(run_dir))} --job-id "{job_id}"'


def stack_check_command(run_dir: Path) -> list[str]:
    """The versions every rank checks first (common/stack.py), once before the ranks start: a mismatch is then one
    line and exit status 2 rather than one failure per rank. Without importing the stack, which each rank does
    next for its own check."""
    return ["python", "-m", "recipes.stack", "check", "--run-dir", str(run_dir), "--versions-only"]


def data_prep_command(run_dir: Path, shard: str | None = None) -> str:
    cmd = shlex.join(["python", "-m", "data_prep", "run", "--config", str(run_dir / "config.yaml")])
    return cmd if shard is None else f"{cmd} --shard {shard}"


def data_check_command(run_dir: Path) -> list[str]:
    """data_prep's own check of every shard, reading them as training will (megatron's IndexedDataset)."""
    return ["python", "-m", "data_prep", "verify", "--config", str(run_dir / "config.yaml"), "--shard", "all"]


def export_hf_command(ckpt: CheckpointConfig, run_dir: Path) -> list[str]:
    """The newest complete checkpoint of the run to Hugging Face format (recipes/hf/exporter.py)."""
    out = ckpt.export_dir or str(run_dir / "hf")
    return [
        "python",
        "-m",
        "recipes.hf.exporter",
        "--checkpoint",
        str(run_dir / "checkpoints"),
        "--out",
        str(out),
        "--max-shard-size",
        str(ckpt.export_max_shard_size),
    ]


def eval_loss_entry(run_dir: Path) -> list[str]:
    """What every rank of the training job's shape runs for evaluation.blends (recipes/evaluate.py)."""
    return ["python", "-m", "recipes.evaluate", "--run-dir", str(run_dir)]


def harness_command(run_dir: Path) -> list[str]:
    """lm-eval on the run's Hugging Face model, one process on one node (recipes/evaluation/harness.py)."""
    return ["python", "-m", "recipes.evaluation", "harness", "--run-dir", str(run_dir)]


def report_command(run_dir: Path) -> list[str]:
    return ["python", "-m", "launcher.report", str(run_dir)]


# After the report command: a run that logged no step yet must not fail the job that trained it.
REPORT_FALLBACK = " || echo 'report: nothing to report (see above)'"


# --------------------------------------------------------------------------- srun + pyxis
def _abs_paths(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        if value.startswith("/"):
            yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _abs_paths(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _abs_paths(v)


def container_mounts(cfg: Config) -> list[str]:
    """host:container mounts at identical paths: the repository, results_dir, and the directories of every
    absolute path the training and data preparation configs name (tokenizer, blend prefixes, data dirs, weights
    to start from), so
    paths in config.yaml mean the same thing inside the container."""
    dirs: list[Path] = [REPO, Path(cfg.results_dir)]
    output_dir = cfg.data_preparation.output_dir
    if output_dir and str(output_dir).startswith("/"):
        dirs.append(Path(output_dir))  # created before the data preparation job is submitted
    training = cfg.training
    # Every value of these sections as config.yaml writes it, whatever source or key names a path.
    sections: list[Any] = [training.tokenizer, training.data, training.checkpoint, cfg.data_preparation]
    if "evaluation" in cfg.stages:  # the tasks' data, the model, the held-out files, the blends
        sections.append(cfg.evaluation)
    for path in _abs_paths(to_plain(sections)):
        p = Path(path)
        # A directory is mounted itself; a file or a prefix (.bin/.idx without extension) through its parent.
        mount = p if p.is_dir() else p.parent
        if mount == Path("/"):
            continue
        dirs.append(mount)
    kept: list[Path] = []
    for d in dirs:
        if not any(d == k or k in d.parents for k in kept):
            kept = [k for k in kept if d not in k.parents] + [d]
    mounts = [f"{d}:{d}" for d in kept]
    cluster = cfg.cluster
    for extra in cluster.container_mounts if isinstance(cluster, ContainerCluster) else []:
        mounts.append(extra if ":" in extra else f"{extra}:{extra}")
    return mounts


def job_paths(cfg: Config) -> list[str]:
    """Host directories the jobs read or write, as container_mounts lists them (the repository, results_dir,
    data and tokenizer directories, cluster.container_mounts)."""
    return [m.split(":", 1)[0] for m in container_mounts(cfg)]


def srun_prefix(
    cfg: Config, cluster: SlurmCluster, *, env_keys: Iterable[str] = (), mpi: bool = False, extra: Iterable[str] = ()
) -> list[str]:
    """srun with the pyxis flags (when the job runs in a pyxis container) and the cluster's own srun_args."""
    args = ["srun", *extra]
    if mpi and cluster.mpi:
        args.append(f"--mpi={cluster.mpi}")
    if in_container(cluster) and cluster.container_runtime == "pyxis":
        args += [
            f"--container-image={cluster.container}",
            f"--container-mounts={','.join(container_mounts(cfg))}",
            f"--container-workdir={REPO}",
            "--no-container-mount-home",
        ]
        if cluster.container_writable:
            args.append("--container-writable")
        keys = list(env_keys)
        if keys:
            # Values the image also sets would otherwise win over ours inside the container.
            args.append(f"--container-env={','.join(keys)}")
    args += [str(a) for a in cluster.srun_args]
    return args
