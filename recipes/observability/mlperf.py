"""MLPerf Training logging for the training loop: the `:::MLLOG` events and keys the benchmark's rules require
(mlperf-logging's compliance checker), written by mlperf-logging's mllog from one rank to the job log and to
RUN_DIR/<mlperf.log_file>. Only runs whose config has an `mlperf` section (training=mlperf/<benchmark>) log;
mlperf-logging is imported only then.

The timeline the trainer drives, through its observers (recipes/observability/observers.py, one of the training
loop's callbacks):
    cache_clear, init_start                      init_starts: start, MLPerfLog.open (before the model is built)
    submission_*, hyperparameters, init_stop,    training_starts: run_start (right before the first training step)
    run_start, block_start
    block_stop, eval_start                       evaluation_starts: eval_start (before each evaluation)
    eval_accuracy, eval_stop, [block_start]      evaluation_ends: eval_stop (after it; a new block unless the
                                                 run stops)
    run_stop (status success | aborted),         run_ends: run_stop
    train_samples
The score is run_stop - run_start. Samples are training sequences (`samples_count`).

The logging rank is the last one: it is on the last pipeline stage, holds the validation loss and prints the
job's progress lines.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable

import torch

from common.config import Config, LoraConfig
from common.evaluation import eval_samples
from common.plan import Plan
from recipes.runtime.distributed import any_rank

SUCCESS, ABORTED = "success", "aborted"


def precision_keys(cfg: Config, plan: Plan) -> list[tuple[str, str]]:
    """The lowest numerical precision in the linear layers, attention and communication (rules 6.1 onwards)."""
    fp8 = bool(plan.fp8)
    attention_fp8 = plan.fp8_dot_product_attention
    weights = "bfloat16" if cfg.dtype.bf16 else "fp32"
    return [
        ("lowest_numerical_precision_in_linear", "fp8" if fp8 else weights),
        ("lowest_numerical_precision_in_attn", "fp8" if attention_fp8 else weights),
        # Parameters are all-gathered in the weights' dtype (or FP8 with FP8 param gather); gradients reduce in bf16
        # or fp32.
        ("lowest_numerical_precision_in_comm", "fp8" if plan.fp8_param_gather else weights),
    ]


def run_keys(cfg: Config, plan: Plan, run_name: str, gpu_name: str, init_checkpoint_step: int) -> list[tuple[str, Any]]:
    """Every key logged once before run_start, with the values this run trains with."""
    ml, train = cfg.mlperf, cfg.training
    if ml is None:
        raise ValueError("run_keys: the run has no mlperf section")
    opt, sched = train.optimizer, train.scheduler
    horizon = sched.decay_steps or train.train_steps  # megatron's lr_decay_steps: warmup included
    platform = ml.platform or f"{plan.num_nodes}x{plan.gpus_per_node}x{gpu_name}"
    return [
        ("submission_benchmark", ml.benchmark),
        ("submission_org", ml.org),
        ("submission_division", ml.division),
        ("submission_status", ml.status),
        ("submission_platform", platform),
        ("number_of_nodes", plan.num_nodes),
        ("accelerators_per_node", plan.gpus_per_node),
        ("seed", cfg.seed),
        ("global_batch_size", plan.global_batch_size),
        ("micro_batch_size", plan.micro_batch_size),
        ("gradient_accumulation_steps", plan.num_microbatches),
        ("max_sequence_length", plan.seq_length),
        ("eval_samples", eval_samples(train, plan.global_batch_size)),
        ("init_checkpoint_step", init_checkpoint_step),
        ("max_steps", horizon),
        ("opt_name", "adamw"),
        ("opt_base_learning_rate", opt.lr),
        ("opt_end_learning_rate", opt.min_lr),
        ("opt_learning_rate_warmup_steps", sched.warmup_steps),
        ("opt_learning_rate_decay_steps", horizon - sched.warmup_steps),
        ("opt_learning_rate_training_steps", horizon),
        ("opt_learning_rate_decay_schedule", "cosine with linear warmup"),
        ("opt_adamw_beta_1", opt.adam_beta1),
        ("opt_adamw_beta_2", opt.adam_beta2),
        ("opt_adamw_epsilon", opt.adam_eps),
        ("opt_adamw_weight_decay", opt.weight_decay),
        ("opt_gradient_clip_norm", opt.clip_grad),
        ("tensor_parallelism", plan.tp),
        ("pipeline_parallelism", plan.pp),
        ("context_parallelism", plan.cp),
        ("expert_parallelism", 1),
        *precision_keys(cfg, plan),
        *lora_keys(cfg),
        ("config_filename", f"{run_name}/config.yaml"),
    ]


def lora_keys(cfg: Config) -> list[tuple[str, Any]]:
    """The adapters' keys of a LoRA run (llama2_70b_lora's rules require lora_rank and lora_alpha)."""
    if not isinstance(cfg.peft, LoraConfig):
        return []
    return [("lora_rank", cfg.peft.rank), ("lora_alpha", cfg.peft.alpha)]


def drop_page_cache() -> bool:
    """Write back and drop the page cache (the rules ask for a cold start); False where not permitted."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _stream_logger(path: str) -> logging.Logger:
    """MLLOG lines to stdout (the job log) and appended to `path`."""
    logger = logging.getLogger(f"recipes.mllog.{path}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    _close_handlers(logger)  # a second log in the same process (tests) must not write every line twice
    for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(path, mode="a")):
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    return logger


def _close_handlers(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


class MLPerfLog:
    """The MLLOG writer of the logging rank; on the other ranks and for runs without an `mlperf` section every
    method does nothing. `clock` (seconds) stamps the events; tests drive it by hand."""

    def __init__(
        self,
        mllogger=None,
        cfg: Config | None = None,
        plan: Plan | None = None,
        run_dir: str = "",
        gpu_name: str = "",
        clock: Callable[[], float] = time.time,
    ):
        self._mllog = mllogger
        self.cfg, self.plan, self.run_dir, self.gpu_name, self.clock = cfg, plan, run_dir, gpu_name, clock

    @classmethod
    def open(
        cls,
        run_dir: str,
        cfg: Config,
        plan: Plan,
        logs_here: bool,
        cache_cleared: bool,
        gpu_name: str = "",
        clock: Callable[[], float] = time.time,
    ) -> "MLPerfLog":
        """Start the log (cache_clear, init_start) on the logging rank of an MLPerf run."""
        if cfg.mlperf is None or not logs_here:
            return cls()
        from mlperf_logging.mllog import mllog  # an optional package: only MLPerf runs need it

        path = os.path.join(run_dir, cfg.mlperf.log_file)
        # stack offset 5: the file and line in each event's metadata are the trainer's call of its callbacks
        # (recipes/runtime/callbacks.py), which call the observer (recipes/observability/observers.py) that calls
        # this class.
        writer = mllog.MLLogger(
            logger=_stream_logger(path),
            default_stack_offset=5,
            root_dir=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        )
        log = cls(writer, cfg, plan, run_dir, gpu_name, clock)
        log._log("event", "cache_clear", cache_cleared)
        log._log("start", "init_start")
        return log

    @property
    def enabled(self) -> bool:
        return self._mllog is not None

    def _log(self, kind: str, key: str, value: Any = None, **metadata: Any) -> None:
        if self._mllog is not None:
            getattr(self._mllog, kind)(
                key=key, value=value, metadata=metadata or None, time_ms=int(self.clock() * 1000)
            )

    def run_start(self, consumed_samples: int, init_checkpoint_step: int = 0) -> None:
        if not self.enabled or self.cfg is None or self.plan is None:
            return
        for key, value in run_keys(
            self.cfg, self.plan, os.path.basename(self.run_dir), self.gpu_name, init_checkpoint_step
        ):
            self._log("event", key, value)
        self._log("end", "init_stop")
        self._log("start", "run_start")
        self._log("start", "block_start", samples_count=consumed_samples)

    def eval_start(self, consumed_samples: int) -> None:
        self._log("end", "block_stop", samples_count=consumed_samples)
        self._log("start", "eval_start", samples_count=consumed_samples)

    def eval_stop(self, consumed_samples: int, log_perplexity: float | None, run_goes_on: bool) -> None:
        if log_perplexity is not None:
            self._log("event", "eval_accuracy", float(log_perplexity), samples_count=consumed_samples)
        self._log("end", "eval_stop", samples_count=consumed_samples)
        if run_goes_on:
            self._log("start", "block_start", samples_count=consumed_samples)

    def run_stop(self, reached_target: bool, consumed_samples: int) -> None:
        """The end of the timed run; closes the log file."""
        self._log("end", "run_stop", status=SUCCESS if reached_target else ABORTED)
        self._log("event", "train_samples", consumed_samples)
        if self._mllog is not None:
            _close_handlers(self._mllog.logger)
            self._mllog = None


def start(run_dir: str, cfg: Config, plan: Plan, local_rank: int, logs_here: bool) -> MLPerfLog:
    """On every rank, before the model is built: for an MLPerf run, drop the page cache once per node (when
    mlperf.drop_caches) and open the log on the logging rank. Other runs get a log that does nothing."""
    ml = cfg.mlperf
    if ml is None:
        return MLPerfLog()
    try:  # on every rank, before any collective: a missing package stops every rank instead of hanging the rest
        import mlperf_logging.mllog  # noqa: F401
    except ImportError:
        raise SystemExit(
            "MLPerf runs log with mlperf-logging, which this Python does not have: pip install "
            "'mlperf-logging>=4.1.68' (its mllog and compliance checker need no more than pyyaml: "
            "--no-deps is enough)"
        ) from None
    dropped = drop_page_cache() if ml.drop_caches and local_rank == 0 else True
    cleared = ml.drop_caches and not any_rank(not dropped)
    return MLPerfLog.open(run_dir, cfg, plan, logs_here, cleared, gpu_name=torch.cuda.get_device_name())
