"""Experiment tracking: the per-step numbers of metrics.jsonl into TensorBoard event files (RUN_DIR/tensorboard/)
and, when enabled, a Weights & Biases run (online, or offline into RUN_DIR/wandb/).

A resumed run continues the same curves: TensorBoard's writer starts with purge_step = the resumed step + 1, so
readers drop whatever the interrupted run logged after its checkpoint; the W&B run id is kept in the run
directory and W&B ignores steps at or below the last one it holds."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
import importlib.util
import json
import os
import re
import secrets
import socket
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

import yaml

from common.config import Config, LoggingConfig
from common.files import atomic_write
from common.plan import Plan
from common.typed import to_plain
from recipes.runtime.stop_signals import helpers_immune_to_stop_signals

if TYPE_CHECKING:
    import wandb  # optional at run time; only its types are needed here

# StepMetrics field -> tag, the same in TensorBoard and W&B.
SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "consumed_samples": "train/consumed_samples",
    "step_time_s": "perf/step_time_s",
    "tokens_per_s": "perf/tokens_per_s",
    "tokens_per_s_per_gpu": "perf/tokens_per_s_per_gpu",
    "trained_tokens_per_s": "perf/trained_tokens_per_s",  # fine-tuning: the loss mask's tokens
    "tflops_per_gpu": "perf/tflops_per_gpu",
    "mfu": "perf/mfu",
    "peak_memory_gib": "memory/peak_gib",
    "val_loss": "val/loss",
}
WANDB_ID_FILE = "wandb_run_id.txt"
WANDB_HOST = ("api.wandb.ai", 443)
WandbMode = Literal["online", "offline"]


def _fields(record: Any) -> dict[str, Any]:
    """A metrics record (a StepMetrics or its dict) as a dict."""
    return asdict(record) if is_dataclass(record) and not isinstance(record, type) else dict(record)


def scalars(record: Any) -> dict[str, float]:
    """The tags and values of one metrics record (a StepMetrics or its dict); absent values are left out."""
    values = _fields(record)
    return {tag: float(values[key]) for key, tag in SCALARS.items() if values.get(key) is not None}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and None become text (TensorBoard's hparams take scalars only)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value)
    return flat


def missing_packages(logging: LoggingConfig) -> list[str]:
    """One line per tracking backend that is enabled but not importable, naming the fix."""
    problems = []
    if logging.tensorboard and importlib.util.find_spec("tensorboard") is None:
        problems.append(
            "logging.tensorboard=true needs the tensorboard package: pip install tensorboard, or set "
            "logging.tensorboard=false"
        )
    if logging.wandb.enabled and importlib.util.find_spec("wandb") is None:
        problems.append(
            "logging.wandb.enabled=true needs the wandb package: pip install wandb, or set logging.wandb.enabled=false"
        )
    return problems


# --------------------------------------------------------------------------- W&B mode
def _reachable(address: tuple[str, int], timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(address, timeout=timeout):
            return True
    except OSError:
        return False


def _has_api_key(environ: Mapping[str, str]) -> bool:
    if environ.get("WANDB_API_KEY"):
        return True
    netrc = os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        with open(netrc) as f:
            return "api.wandb.ai" in f.read()
    except OSError:
        return False


def wandb_mode(
    configured: str,
    environ: Mapping[str, str] = os.environ,
    reachable: Callable[[], bool] | None = None,
    has_key: Callable[[], bool] | None = None,
) -> WandbMode:
    """online | offline. `auto` is online only when the W&B server answers and an API key is there: compute nodes
    without internet log offline instead of failing or hanging."""
    if configured == "online":
        return "online"
    if configured == "offline":
        return "offline"
    reachable = reachable or (lambda: _reachable(WANDB_HOST))
    has_key = has_key or (lambda: _has_api_key(environ))
    return "online" if has_key() and reachable() else "offline"


def wandb_run_id(run_dir: str, new_id: Callable[[], str]) -> str:
    """The run directory's W&B run id, created on first use, so every resume continues the same W&B run."""
    path = os.path.join(run_dir, WANDB_ID_FILE)
    if os.path.exists(path):
        with open(path) as f:
            run_id = f.read().strip()
        if run_id:
            return run_id
    run_id = new_id()
    atomic_write(path, run_id + "\n")
    return run_id


def _start_order(name: str) -> tuple[str, int]:
    """W&B names an offline run offline-run-<start second>-<id>, adding -1, -2, ... when the same id starts again
    within that second."""
    match = re.fullmatch(r"offline-run-(\d{8}_\d{6})-[^-]+(?:-(\d+))?", name)
    return (match.group(1), int(match.group(2) or 0)) if match else (name, 0)


def offline_runs(run_dir: str) -> list[str]:
    """RUN_DIR/wandb/offline-run-* directories, oldest first (one per start of a resumed offline run)."""
    root = os.path.join(run_dir, "wandb")
    if not os.path.isdir(root):
        return []
    names = sorted((d for d in os.listdir(root) if d.startswith("offline-run-")), key=_start_order)
    return [os.path.join(root, d) for d in names]


def sync_command(run_dir: str) -> str | None:
    """`wandb sync <dirs>` for the run's offline W&B data, in the order W&B must receive it; None when none."""
    runs = offline_runs(run_dir)
    return "wandb sync " + " ".join(runs) if runs else None


# --------------------------------------------------------------------------- the tracker
class Tracker:
    """Holds the open TensorBoard writer and W&B run of the rank that logs metrics (the last rank)."""

    def __init__(self, run_dir: str, cfg: Config, plan: Plan, resume_step: int, say: Callable[[str], None] = print):
        self.run_dir = run_dir
        self.say = say
        self.tensorboard: Any = None  # a SummaryWriter once opened (torch is taken as untyped)
        self.wandb_run: wandb.Run | None = None
        self.wandb_mode: WandbMode | None = None
        if cfg.logging.tensorboard:
            self._open_tensorboard(cfg, plan, resume_step)
        if cfg.logging.wandb.enabled:
            self._open_wandb(cfg, plan, resume_step)

    def _open_tensorboard(self, cfg: Config, plan: Plan, resume_step: int) -> None:
        # tensorboard is optional (missing_packages names it when logging.tensorboard is on): imported only then.
        from torch.utils.tensorboard import SummaryWriter

        log_dir = os.path.join(self.run_dir, "tensorboard")
        # purge_step: readers drop what an interrupted run wrote after the checkpoint this run resumes from (all of
        # it when there was none), so every step appears once.
        self.tensorboard = SummaryWriter(log_dir=log_dir, purge_step=resume_step + 1)
        if resume_step == 0:
            self._write_hparams(cfg, plan)
        self.tensorboard.flush()  # the purge marker reaches the file even if no step follows

    def _write_hparams(self, cfg: Config, plan: Plan) -> None:
        from torch.utils.tensorboard.summary import hparams  # optional, as in _open_tensorboard

        params = flatten(
            {"config": to_plain(cfg), "plan": {k: v for k, v in plan.to_json_dict().items() if k != "env"}}
        )
        # The session's metrics, so TensorBoard's HParams tab shows them next to the hyperparameters.
        metrics = {"train/loss": 0.0, "val/loss": 0.0, "perf/tokens_per_s_per_gpu": 0.0, "perf/mfu": 0.0}
        writer = self.tensorboard._get_file_writer()  # what add_hparams does, without its extra sub-run
        for summary in hparams(params, metrics):
            writer.add_summary(summary)
        self.tensorboard.add_text("config", "```\n" + yaml.safe_dump(to_plain(cfg), sort_keys=False) + "```", 0)
        self.tensorboard.add_text("plan", "```\n" + json.dumps(plan.to_json_dict(), indent=2) + "\n```", 0)

    def _open_wandb(self, cfg: Config, plan: Plan, resume_step: int) -> None:
        import wandb  # an optional package: only logging.wandb.enabled needs it

        wandb_cfg = cfg.logging.wandb
        self.wandb_mode = wandb_mode(wandb_cfg.mode or "auto")
        run_id = wandb_run_id(self.run_dir, lambda: secrets.token_hex(6))
        settings: dict[str, Any] = dict(
            project=wandb_cfg.project,
            entity=wandb_cfg.entity,
            name=wandb_cfg.name or cfg.run_name,
            id=run_id,
            resume="allow",
            dir=self.run_dir,
            config={"config": to_plain(cfg), "plan": plan.to_json_dict()},
        )
        # W&B's service process must outlive Slurm's SIGTERM/SIGUSR1 until the trainer has saved and finished.
        with helpers_immune_to_stop_signals():
            try:
                self.wandb_run = wandb.init(mode=self.wandb_mode, **settings)
            except Exception as err:  # a refused login or an unreachable server must not stop training
                if self.wandb_mode == "offline":
                    raise
                self.say(f"wandb: online start failed ({str(err).splitlines()[0]}); logging offline instead")
                self.wandb_mode = "offline"
                self.wandb_run = wandb.init(mode="offline", **settings)
        where = "offline, in " + os.path.join(self.run_dir, "wandb") if self.wandb_mode == "offline" else "online"
        self.say(f"wandb: run {run_id} ({where})" + (f", resuming after step {resume_step}" if resume_step else ""))

    def log(self, record: Any) -> None:
        """One logged step (StepMetrics); flushed at once, so a crash loses nothing a resume would not redo."""
        values = scalars(record)
        step = int(_fields(record)["step"])
        if self.tensorboard is not None:
            for tag, value in values.items():
                self.tensorboard.add_scalar(tag, value, step)
            self.tensorboard.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None
            if self.wandb_mode == "offline":
                self.say(
                    f"wandb: offline run in {os.path.join(self.run_dir, 'wandb')}; upload it from a machine "
                    f"with internet: {sync_command(self.run_dir)}"
                )
