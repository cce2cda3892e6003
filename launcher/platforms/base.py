"""What a platform is, and what every platform shares.

A platform lays out the stage jobs (container, data_preparation, data_check, preflight, training, export) for one
kind of cluster, renders their files, and runs or submits them. The plan and the commands the jobs run
(launcher/jobs/commands.py) are the same everywhere. `cluster.platform` picks the platform: platform_of (in
launcher/platforms/registry.py) takes PLATFORM from launcher/platforms/<cluster.platform>.py. The plan's checks and
the run directory ask the platform what they need of it through the caller (cli.py passes it in): the platforms
stand above launcher/plan/ and launcher/jobs/, which never import them.

A new platform is one file, launcher/platforms/<name>.py, ending with `PLATFORM = <its Platform subclass>()`:
1. Class attributes: `name` (<name>), `cluster_class` (its cluster keys' class in common/config.py), `suffix` (the
   end of its job files' names; training's file is `submission<suffix>`), `resubmit` (the command a job file's
   header gives for submitting it again by hand).
2. The jobs: `data_preparation_jobs` and `training_job` (each Job made with `self.job`), and `render_script`, the
   text of a job's own file (which starts with `header_lines` and exports `env_lines`).
3. Submission, unless the jobs run on this machine: `client` (the command that submits, which main.py looks for),
   `chain` (how each job waits for the one before), `submit`, `chain_as_shell`, and for the lines printed after
   submitting `waits_for` and `follow_command` (and `log_of` where logs are not logs/<stage>_<job id>.out).
4. Where it differs from the defaults: `problems` (the default, for a cluster class with ContainerCluster's keys,
   checks cluster.container_runtime against `runtimes`, the image unless the container stage builds it, and the
   time limits), `render` (files besides the job's own), `container_wrapper` (how a command enters the image; the
   default: `apptainer exec`).
5. What it runs besides data preparation and training: `preflight_job`, `export_job`, `evaluation_job` and
   `rank_variable` (the profiled ranks of profile.tool=nsys) are refused by default, in one line naming the way
   around (the evaluation's blends run in the training job's shape, `training_job(..., stage="eval_loss")`); the
   container stage builds cluster.container unless `builds_images = False` (images run by name from a registry).
Then its golden files (tests/golden/, written by tests like tests/launcher/test_render.py). Users pick it with a
conf/cluster/<cluster>.yaml that names it, which the config schema checks (common/config.py:
PlatformName, and a class for its cluster keys).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from common.config import BatchCluster, ClusterConfig, Config, ContainerCluster, DataJobConfig, K8sCluster
from common.evaluation import offline_env
from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.commands import REPO
from launcher.jobs.nsys import nsys_entry, nsys_requested
from launcher.jobs.render import Job
from launcher.jobs.stages import StagePlan
from launcher.jobs.submit import Submitted
from launcher.plan.errors import PlanError
from launcher.platforms import containers

Say = Callable[[str], None]
# The cluster keys of one platform (common/config.py: SlurmCluster, ...).
ClusterT = TypeVar("ClusterT", bound=ClusterConfig)

IMAGE_HELP = "docs/stack.md: Images for NGC Base Command and Kubernetes"

# What the checks print for something the selected stages ask of a platform that it cannot do: one line naming
# the cluster and the way around it.
REFUSALS = {
    "container": "stages has container but cluster={cluster} runs images by name from a registry and builds none: "
    f"build and push the image with docker ({IMAGE_HELP}), set cluster.container to its name and drop "
    "container from stages",
    "export": "stages has export but cluster={cluster} has no export job yet: drop export from stages and run "
    "`python -m recipes.hf.exporter --checkpoint RUN_DIR/checkpoints --out DIR` where the checkpoint is",
    "preflight": "stages has preflight but cluster={cluster} has no preflight job yet: drop preflight from stages, "
    "or run it on cluster=local or a Slurm cluster",
    "evaluation": "stages has evaluation but cluster={cluster} has no evaluation job yet: drop evaluation from "
    "stages, or run it on cluster=local or a Slurm cluster",
    "nsys": "profile.tool=nsys cannot wrap the profiled ranks on cluster={cluster} yet: use profile.tool=torch",
    "job_restarts": "resilience.job_restarts={job_restarts}: cluster={cluster} has no jobs that wait for the one "
    "before them to end however it ended ({why})",
    "in_job_restarts": "resilience.in_job_restarts={in_job_restarts}: cluster={cluster} cannot start the ranks "
    "under ft_launcher yet ({why}); set resilience.in_job_restarts=0",
    "export_after_chain": "stages has export and resilience.job_restarts={job_restarts}: the export would wait on a "
    "chain of training jobs that ends early once training finished; drop export from "
    "stages and run stages=[export] with the same run_name when training finished",
}


class Platform(ABC, Generic[ClusterT]):
    """One kind of cluster: a subclass sets the attributes below and implements the abstract methods (the module
    docstring says which); the rest are working defaults it may override."""

    name: str
    cluster_class: type[ClusterT]
    suffix: str
    resubmit: str
    # The command that submits jobs; None: the jobs run on this machine, one after another.
    client: str | None = None
    # How each submitted job waits for the one before it (the dry run says it before the chain).
    chain: str = "one after another on this machine"
    # cluster.container_runtime values the jobs can run with (the default problems() checks it).
    runtimes: tuple[str, ...] = containers.RUNTIMES
    # What the time-limit messages call a valid cluster.time_limit.
    time_format: str = "a time limit"
    # False where jobs run images by name from a registry: the container stage has nothing to build.
    builds_images: bool = True
    # The variable holding a rank's global number, which the nsys wrapper reads (profile.tool=nsys); None: the
    # platform cannot wrap ranks.
    rank_variable: str | None = None
    # Long runs (resilience): whether a job can be queued to start once the one before it ended however it ended
    # (resilience.job_restarts chains the training jobs up front), and whether training can run under
    # ft_launcher (resilience.in_job_restarts); where not, why not, for the one-line refusal.
    chains_jobs: bool = False
    no_job_chain: str = ""
    runs_ft_launcher: bool = False
    no_ft_launcher: str = ""

    def cluster_of(self, cfg: Config) -> ClusterT:
        """cfg.cluster with this platform's own keys (the registry picked this platform by them)."""
        cluster = cfg.cluster
        if not isinstance(cluster, self.cluster_class):
            raise TypeError(f"cluster.platform={cluster.platform} is not cluster.platform={self.name}")
        return cluster

    # ----------------------------------------------------------------------- what it can do
    @property
    def runs_here(self) -> bool:
        """The jobs run on this machine, one after another, rather than being submitted."""
        return self.client is None

    def supports(self, need: str) -> bool:
        """Whether this platform can do `need`: the container, preflight, export or evaluation stage, or "nsys" (the
        profiled ranks' wrapper). A subclass supports preflight, export and evaluation by implementing their job."""
        if need == "container":
            return self.builds_images
        if need == "nsys":
            return self.rank_variable is not None
        method = f"{need}_job"
        return getattr(type(self), method) is not getattr(Platform, method)

    def refusals(self, cfg: Config, selected: Sequence[str]) -> list[str]:
        """One line for each thing the selected stages (and profile.tool=nsys) ask of this platform that it cannot
        do, in stage order."""
        needs = [stage for stage in ("container", "export", "preflight", "evaluation") if stage in selected]
        if nsys_requested(cfg.profile):
            needs.append("nsys")
        return [self._refusal(cfg, need) for need in needs if not self.supports(need)]

    def _refusal(self, cfg: Config, need: str) -> str:
        return REFUSALS[need].format(cluster=cfg.cluster.name)

    def resilience_refusals(self, cfg: Config) -> list[str]:
        """One line for each resilience setting this platform cannot honour."""
        chain, in_job = cfg.resilience.job_restarts, cfg.resilience.in_job_restarts
        found = []
        values = dict(cluster=cfg.cluster.name, job_restarts=chain, in_job_restarts=in_job)
        if chain and not self.chains_jobs:
            found.append(REFUSALS["job_restarts"].format(why=self.no_job_chain, **values))
        elif chain and "export" in cfg.stages and "training" in cfg.stages:
            found.append(REFUSALS["export_after_chain"].format(**values))
        if in_job and not self.runs_ft_launcher:
            found.append(REFUSALS["in_job_restarts"].format(why=self.no_ft_launcher, **values))
        return found

    # ----------------------------------------------------------------------- checks
    def stage_problems(self, cfg: Config, dry_run: bool) -> tuple[list[str], list[str]]:
        """(problems, warnings) of the selected stages on this platform (launcher/plan/checks/stages.py asks):
        its own problems, the image the container stage would build, what it cannot do."""
        selected = cfg.stages
        problems, warnings = self.problems(cfg, selected, dry_run)
        if "container" in selected and self.supports("container"):
            cluster = containers.image_cluster(cfg.cluster)
            problems += containers.build_problems(cluster, self.runs_here, dry_run)[0]
        # What the stages ask of the platform that it cannot do, one line each.
        return problems + self.refusals(cfg, selected), warnings

    def problems(self, cfg: Config, selected: Sequence[str], dry_run: bool) -> tuple[list[str], list[str]]:
        """(problems, warnings) only this platform knows about, before anything is written. The default suits a
        scheduler whose jobs run in cluster.container (or bare metal): the runtime, the image unless the container
        stage builds it, the environment the runtime passes, the time limits."""
        cluster = cfg.cluster
        if not isinstance(cluster, ContainerCluster):  # the other platforms check their own keys
            raise NotImplementedError(f"cluster.platform={self.name} needs its own problems()")
        found = containers.runtime_problems(cluster, self.runtimes)
        if found:
            return found, []
        found, warnings = ([], []) if "container" in selected else containers.image_problems(cluster, dry_run)
        found += containers.env_problems(cluster, cluster.env)
        return found + self.limit_problems(cfg, cluster, selected), warnings

    def limit_problems(
        self, cfg: Config, cluster: BatchCluster, selected: Sequence[str], finite: bool = False
    ) -> list[str]:
        """cluster.time_limit (finite: not UNLIMITED), the signal margin before it, the preflight's limit, and the
        data preparation tasks' limits and sizes."""
        problem = self._time_problem("cluster.time_limit", cluster.time_limit, finite)
        if problem:
            return [problem]
        limit = time_seconds(cluster.time_limit)
        margin = signal_margin(cluster) or 0
        if limit is not None and margin >= limit:
            return [
                f"cluster.signal_before_timeout_s={margin} must be shorter than cluster.time_limit="
                f"{cluster.time_limit} ({limit} s)"
            ]
        if "preflight" in selected:
            problem = self._time_problem("preflight.time_limit", cfg.preflight.time_limit, finite)
            if problem:
                return [problem]
        if "data_preparation" in selected:
            return self._data_job_problems(cfg.data_preparation.job, finite)
        return []

    def _data_job_problems(self, job: DataJobConfig, finite: bool) -> list[str]:
        problem = job.time_limit and self._time_problem("data_preparation.job.time_limit", job.time_limit, finite)
        if problem:
            return [problem]
        for key, value in (("cpus_per_task", job.cpus_per_task), ("max_parallel", job.max_parallel)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                return [f"data_preparation.job.{key}={value!r} must be null or a positive integer"]
        return []

    def _time_problem(self, key: str, value: Any, finite: bool) -> str | None:
        try:
            seconds = time_seconds(value)
        except ValueError:
            return f"{key}={value!r} is not {self.time_format} (HH:MM:SS, D-HH:MM:SS or minutes)"
        if finite and seconds is None:
            return f"{key}={value!r}: this platform needs a finite time limit (HH:MM:SS)"
        return None

    def image_name_problems(self, image: str | None, example: str) -> list[str]:
        """Where images run by name from a registry: cluster.container (`image`) must name one, not a file."""
        if image and not str(image).startswith("/"):
            return []
        return [
            f"cluster.container={image!r}: cluster={self.name} runs an image by name from a registry; set "
            f"cluster.container={example} ({IMAGE_HELP})"
        ]

    # ----------------------------------------------------------------------- jobs
    def script_name(self, stage: str) -> str:
        """The job's file in the run directory."""
        return f"{'submission' if stage == 'training' else stage}{self.suffix}"

    def job(self, stage: str, title: str, lines: list[str], **fields: Any) -> Job:
        """A Job of this platform: its script named after the stage."""
        return Job(stage, self.script_name(stage), title, lines, **fields)

    def plan_stages(self, cfg: Config, plan: Plan, run_dir: Path) -> StagePlan:
        """The jobs of cfg.stages, in order, for a config the checks accepted (launcher/plan/validate.py)."""
        selected = cfg.stages
        jobs: list[Job] = []
        notes: list[str] = []
        if "container" in selected:
            # A platform that builds no image refuses the stage in container_job.
            image = containers.image_cluster(cfg.cluster).container if self.builds_images else None
            if image and Path(image).exists():
                notes.append(f"container: {image} exists; nothing to build")
            else:
                jobs.append(self.container_job(cfg, run_dir))
        if "data_preparation" in selected:
            from data_prep.shards import list_shards  # loaded for this stage only: other runs do without it

            jobs += self.data_preparation_jobs(cfg, run_dir, len(list_shards(cfg.data_preparation)))
        if "preflight" in selected:
            jobs.append(self.preflight_job(cfg, plan, run_dir))
        # Built whatever the stages: plan.command records how training is launched.
        training, command = self.training_job(cfg, plan, run_dir, self.rank_entry(cfg, run_dir))
        if "training" in selected:
            jobs.append(training)
        if "export" in selected:
            jobs.append(self.export_job(cfg, run_dir))
        if "evaluation" in selected:
            jobs += self.evaluation_jobs(cfg, plan, run_dir)
        for job in jobs[:-1]:
            job.followed = True
        return StagePlan(jobs=jobs, command=command, notes=notes)

    @abstractmethod
    def data_preparation_jobs(self, cfg: Config, run_dir: Path, num_shards: int) -> list[Job]:
        """The jobs that prepare the shards and check them."""

    @abstractmethod
    def training_job(
        self, cfg: Config, plan: Plan, run_dir: Path, entry: list[str], stage: str = "training"
    ) -> tuple[Job, str]:
        """The training job and its launch command (plan.command); `entry` is what every rank runs
        (rank_entry). Another `stage` (eval_loss) is a job of the same shape running another entry, without the
        report that ends training."""

    def rank_entry(self, cfg: Config, run_dir: Path) -> list[str]:
        """What every training rank runs: the training entry, or with profile.tool=nsys a wrapper that runs it
        under nsys on the profiled ranks, which it tells by rank_variable."""
        entry = commands.training_entry(run_dir)
        if not nsys_requested(cfg.profile):
            return entry
        if self.rank_variable is None:
            raise PlanError([self._refusal(cfg, "nsys")])
        # Under ft_launcher every rank gets torchrun's variables, whatever started ft_launcher.
        variable = "RANK" if cfg.resilience.in_job_restarts else self.rank_variable
        return nsys_entry(cfg.profile, run_dir, entry, variable) or entry

    def container_job(self, cfg: Config, run_dir: Path) -> Job:
        """The image build into cluster.container with its runtime (enroot or apptainer), and the files it
        reads."""
        if not self.builds_images:
            raise PlanError([self._refusal(cfg, "container")])
        cluster = containers.image_cluster(cfg.cluster)
        lines, files = containers.build_lines(cluster, run_dir)
        return self.job("container", containers.build_title(cluster), lines, files=files)

    def preflight_job(self, cfg: Config, plan: Plan, run_dir: Path) -> Job:
        """The network preflight in the training job's shape."""
        raise PlanError([self._refusal(cfg, "preflight")])

    def export_job(self, cfg: Config, run_dir: Path) -> Job:
        """One process on one node exporting the run's newest checkpoint to Hugging Face format."""
        raise PlanError([self._refusal(cfg, "export")])

    def evaluation_jobs(self, cfg: Config, plan: Plan, run_dir: Path) -> list[Job]:
        """The evaluation stage: the loss of evaluation.blends in the training job's shape (eval_loss), then the
        lm-eval tasks and the held-out perplexity task on one node (evaluation); each only where configured."""
        ev = cfg.evaluation
        jobs = [self.eval_loss_job(cfg, plan, run_dir)] if ev.blends else []
        if ev.tasks or ev.heldout:
            jobs.append(self.evaluation_job(cfg, run_dir))
        return jobs

    def eval_loss_job(self, cfg: Config, plan: Plan, run_dir: Path) -> Job:
        """Every rank of the training job's shape (its nodes, ranks, environment and image) running
        recipes/evaluation/loss.py from the newest checkpoint; no restarts, no signal before the time limit."""
        resilience = dataclasses.replace(cfg.resilience, job_restarts=0, in_job_restarts=0)
        once = dataclasses.replace(cfg, resilience=resilience)
        job, _ = self.training_job(once, plan, run_dir, commands.eval_loss_entry(run_dir), stage="eval_loss")
        names = ", ".join(blend.name for blend in cfg.evaluation.blends)
        job.title = f"Held-out loss of {names} from the newest checkpoint on the training job's {gpus(plan.num_gpus)}"
        job.signal = None
        job.time_limit = cfg.evaluation.time_limit
        return job

    def evaluation_job(self, cfg: Config, run_dir: Path) -> Job:
        """lm-eval on the run's Hugging Face model: one process on one node, the model sharded over its GPUs, the
        hub off (commands.harness_command, evaluation_env)."""
        raise PlanError([self._refusal(cfg, "evaluation")])

    def container_wrapper(self, cfg: Config, env: Mapping[str, str] = {}) -> list[str]:
        """What goes before a command to run it in cluster.container: `apptainer exec ... image.sif` with the
        given variables set, or nothing (bare metal, this machine, or pyxis, which works through srun's flags)."""
        cluster = cfg.cluster
        if (
            isinstance(cluster, ContainerCluster)
            and commands.in_container(cluster)
            and cluster.container_runtime == "apptainer"
        ):
            return containers.apptainer_exec(cfg, cluster, env)
        return []

    # ----------------------------------------------------------------------- rendering
    def render(self, job: Job, cfg: Config, run_dir: Path) -> dict[str, str]:
        """File name -> text: the job's own file first, then the files it reads."""
        return {job.script: self.render_script(job, cfg, run_dir), **job.files}

    @abstractmethod
    def render_script(self, job: Job, cfg: Config, run_dir: Path) -> str:
        """The text of the job's own file (job.script), which is run or submitted."""

    def header_lines(self, job: Job, run_dir: Path, title: str | None = None) -> list[str]:
        """The comment lines a job's file starts with: what it does, and how to run or submit it again."""
        again = "run" if self.runs_here else "submit"
        return [
            f"# {title or job.title}",
            f"# Written by main.py for {run_dir.name}; {again} it again with: {self.resubmit} "
            f"{shlex.quote(str(run_dir / job.script))}",
        ]

    def env_lines(self, job: Job) -> list[str]:
        """The job's environment: the repository on PYTHONPATH, job.path_first first on PATH, job.env."""
        lines = [f"export PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}"]
        if job.path_first:
            lines.append(f"export PATH={shlex.quote(job.path_first)}:$PATH")
        return lines + [f"export {key}={shlex.quote(value)}" for key, value in job.env.items()]

    # ----------------------------------------------------------------------- submission
    def chain_as_shell(self, jobs: list[Job], run_dir: Path, cfg: Config) -> list[str]:
        """What submit runs, as shell lines (the dry run prints them; they also submit by hand); none where the
        jobs run here."""
        return []

    def submit(self, jobs: list[Job], run_dir: Path, cfg: Config, say: Say = print) -> list[Submitted]:
        """Submit the jobs, each to start once the one before it succeeded."""
        raise NotImplementedError(f"cluster.platform={self.name} runs its jobs on this machine (run_here)")

    def follow(self, jobs: list[Job], submitted: list[Submitted], run_dir: Path) -> list[str]:
        """Lines printed after submitting: each job, what it waits for and its log; how to follow them."""
        lines = []
        for (job, _), sub in zip(queued(jobs), submitted):
            after = f" ({self.waits_for(sub.dependency)})" if sub.dependency else ""
            log = self.log_of(job, sub.job_id, run_dir)
            lines.append(f"submitted {job.stage}: job {sub.job_id}{after}" + (f"; log {log}" if log else ""))
        lines.append(f"  follow with: {self.follow_command(submitted)}" + next_step([j.stage for j in jobs], run_dir))
        return lines

    def waits_for(self, dependency: str) -> str:
        """A submitted job's dependency (as jobs.json records it) in words, for follow()."""
        raise NotImplementedError(f"cluster.platform={self.name} submits nothing")

    def log_of(self, job: Job, job_id: str, run_dir: Path) -> str | None:
        """Where a submitted job writes its output (the tasks' logs of an array job)."""
        return f"{run_dir}/logs/{job.stage}_{job_id}" + ("_*" if job.array_size else "") + ".out"

    def follow_command(self, submitted: list[Submitted]) -> str:
        """The command that shows the submitted jobs."""
        raise NotImplementedError(f"cluster.platform={self.name} submits nothing")


def next_step(stages: list[str], run_dir: Path) -> str:
    """What to run once the submitted jobs are done, for what they make: the report reads training's step timings,
    which data preparation and the image build have none of."""
    if "training" in stages or "evaluation" in stages or "eval_loss" in stages:
        return f"   report: python -m launcher.report {run_dir}"
    if "data_preparation" in stages:
        return f"   shards: python -m data_prep list --config {run_dir / 'config.yaml'}"
    return ""


# --------------------------------------------------------------------------- chains of training jobs
def queued(jobs: list[Job]) -> list[tuple[Job, bool]]:
    """The submissions of the stage jobs, in order: (job, whether it waits for the one before to end however it
    ended rather than to succeed): a training job with restarts is submitted 1 + restarts times."""
    return [(job, repeat > 0) for job in jobs for repeat in range(1 + job.restarts)]


def chain_lines(
    cfg: Config, run_dir: Path, run_here: Callable[[str], str], job_id: str, cancel: str, how: str
) -> tuple[list[str], list[str]]:
    """The lines a chained training job runs before and after training (resilience.job_restarts): it asks
    common/job_chain.py whether it still has work and cancels the jobs queued behind it once the run is finished
    or must stop. `run_here(command)` is the command as one line run once in the job's environment (srun, the
    container), `job_id` the scheduler's job id variable, `cancel` a shell line cancelling this run's jobs still
    queued, `how` the way each job waits for the one before."""
    jobs = 1 + cfg.resilience.job_restarts
    begin = run_here(commands.job_chain_command(run_dir, "begin", job_id))
    end = run_here(commands.job_chain_command(run_dir, "end", job_id))
    before = [
        f"# resilience.job_restarts={jobs - 1}: this job is one of {jobs} queued up front, each starting once the one "
        f"before it ended ({how}).",
        "# It trains only while training is not finished and the jobs before it saved new checkpoints "
        "(common/job_chain.py);",
        "# when not, it cancels the jobs still queued behind it.",
        f"cancel_queued() {{ {cancel} || true; }}",
        "chain=0",
        f"{begin} || chain=$?",
        'if [ "$chain" -ne 0 ]; then cancel_queued; exit "$(( chain != 10 ))"; fi',
    ]
    after = [
        "# Once training is finished, the jobs queued behind this one have nothing to do.",
        "chain=0",
        f"{end} || chain=$?",
        'if [ "$chain" -eq 10 ]; then cancel_queued; fi',
    ]
    return before, after


# --------------------------------------------------------------------------- job titles
def gpus(n: int) -> str:
    return f"{n} GPU" + ("s" if n != 1 else "")


def training_title(plan: Plan, how: str) -> str:
    nodes = f"{plan.num_nodes} node{'s' if plan.num_nodes > 1 else ''} x {plan.gpus_per_node}"
    return f"Train {plan.model} ({plan.dtype}) on {gpus(plan.num_gpus)}: {nodes}, {how}"


def export_title(run_dir: Path) -> str:
    return f"Export the newest checkpoint of {run_dir.name} to Hugging Face format"


def evaluation_title(cfg: Config, run_dir: Path) -> str:
    ev = cfg.evaluation
    what = [f"{len(ev.tasks)} lm-eval task{'s' if len(ev.tasks) != 1 else ''}"] if ev.tasks else []
    what += ["held-out perplexity"] if ev.heldout else []
    return f"Evaluate {ev.model or run_dir.name + ' (its export)'}: {' and '.join(what)} on one node"


def evaluation_env(cfg: Config) -> dict[str, str]:
    """The evaluation job's environment: the hub off, the tasks' data where fetch put it."""
    return offline_env(cfg.evaluation.data_dir)


def preflight_title(plan: Plan) -> str:
    return f"Network preflight: all-reduce bandwidth over the {gpus(plan.num_gpus)} of the training job"


# --------------------------------------------------------------------------- time limits and paths
def signal_margin(cluster: BatchCluster) -> int | None:
    """The seconds before the time limit at which the ranks are told to checkpoint and stop: Slurm's and Grid
    Engine's SIGUSR1, Kubernetes' grace after SIGTERM; Base Command sends nothing."""
    return cluster.signal_before_timeout_s if isinstance(cluster, (ContainerCluster, K8sCluster)) else None


def time_seconds(value: Any) -> int | None:
    """Seconds in a time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None for unlimited.
    Raises ValueError for anything else."""
    text = str(value).strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise ValueError(text)
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return int(a) * 3600 + int(b) * 60 + int(c)
    return int(a) * 60 + int(b or 0)  # MM[:SS]


def hms(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def outside_mounts(paths: list[str], mounts: list[str]) -> list[str]:
    """The paths that lie under none of the mount points."""
    roots = [Path(m) for m in mounts]
    return [p for p in paths if not any(Path(p) == r or r in Path(p).parents for r in roots)]
