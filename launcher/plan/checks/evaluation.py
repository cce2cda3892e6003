"""The evaluation stage: something to evaluate, each lm-eval task's data prepared (or the task one of the user's
own), the model to evaluate there (or exported first), a model that fits one node, the held-out files and the
blends there, each blend's sequences splitting over the data-parallel ranks."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from common.checkpoints import latest_checkpoint
from common.config import Config, Stage
from common import lm_eval_index
from common.evaluation import FETCH_COMMAND, HELDOUT_TASK, eval_samples, fetched_tasks
from launcher.plan.findings import Findings
from launcher.plan.formulas import layer_parameters
from launcher.plan.sizes import Sizes

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Weights are what must fit; the rest (activations of one batch, the KV cache, the CUDA context) is taken as this
# share on top.
OVERHEAD = 1.2
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    if Stage.evaluation not in cfg.stages:
        return
    ev = cfg.evaluation
    if not (ev.tasks or ev.heldout or ev.blends):
        found.problem(
            "stages has evaluation but evaluation.tasks, evaluation.heldout and evaluation.blends are all empty: "
            "name what to evaluate (docs/evaluation.md)"
        )
        return
    if ev.dtype not in DTYPE_BYTES:
        found.problem(f"evaluation.dtype={ev.dtype!r} must be one of {', '.join(DTYPE_BYTES)}")
    _blends(cfg, sizes, found)
    if not (ev.tasks or ev.heldout):
        return
    _tasks(cfg, found)
    for name in ev.heldout:
        if not os.path.isfile(name):
            found.problem_unless_dry_run(
                f"evaluation.heldout: {name} is not a file (JSON lines with a text key, or a text file)"
            )
    _model(cfg, sizes, found)


# --------------------------------------------------------------------------- lm-eval tasks
def _tasks(cfg: Config, found: Findings) -> None:
    ev = cfg.evaluation
    if ev.include_path and not os.path.isdir(ev.include_path):
        found.problem(f"evaluation.include_path={ev.include_path} is not a directory of lm-eval task YAMLs")
        return
    if HELDOUT_TASK in ev.tasks:
        found.problem(
            f"evaluation.tasks names {HELDOUT_TASK}, the held-out perplexity task's own name: list its files in "
            "evaluation.heldout instead"
        )
    ready = lm_eval_index.local_tasks(ev.include_path) | fetched_tasks(ev.data_dir)
    pending = [t for t in ev.tasks if t not in ready and t != HELDOUT_TASK]
    if not pending:
        return
    # Read only when a task is neither fetched nor local: scanning lm-eval's task files takes a few seconds.
    known = lm_eval_index.known(ev.include_path)
    unknown = [t for t in pending if known is not None and t not in known]
    if unknown:
        found.problem(
            f"evaluation.tasks: unknown lm-eval task{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
            "`lm_eval ls tasks` lists the names; a task of your own goes in a YAML under evaluation.include_path"
        )
    missing = [t for t in pending if t not in unknown]
    if missing:
        where = ev.data_dir if os.path.isdir(ev.data_dir) else f"{ev.data_dir} (no such directory)"
        found.problem_unless_dry_run(
            f"evaluation.tasks: no data for {', '.join(missing)} in evaluation.data_dir={where}: fetch it on a "
            f"machine with internet: {FETCH_COMMAND} --tasks {','.join(missing)} --data-dir {ev.data_dir}"
        )


# --------------------------------------------------------------------------- the model and one node
def model_source(cfg: Config) -> str:
    """The Hugging Face directory the tasks run on: evaluation.model, else the run's export."""
    ev, ckpt = cfg.evaluation, cfg.training.checkpoint
    assert cfg.run_name is not None
    return str(ev.model or ckpt.export_dir or Path(cfg.results_dir) / cfg.run_name / "hf")


def model_parameters(cfg: Config) -> int:
    """The evaluated model's parameters: from evaluation.model's safetensors where it is given and there, else
    from training.model (the run's own model, which the export writes)."""
    model = cfg.training.model
    directory = cfg.evaluation.model
    if directory and os.path.isdir(directory):
        files = list(Path(directory).glob("*.safetensors"))
        try:
            dtype = json.loads((Path(directory) / "config.json").read_text()).get("torch_dtype", "bfloat16")
        except (OSError, ValueError):
            dtype = "bfloat16"
        if files:
            return sum(f.stat().st_size for f in files) // DTYPE_BYTES.get(str(dtype), 2)
    return model.num_layers * layer_parameters(model) + 2 * model.vocab_size * model.hidden_size + model.hidden_size


def _model(cfg: Config, sizes: Sizes, found: Findings) -> None:
    ev = cfg.evaluation
    source = model_source(cfg)
    if ev.model and not os.path.isfile(os.path.join(ev.model, "config.json")):
        found.problem_unless_dry_run(f"evaluation.model={ev.model} is not a Hugging Face directory (no config.json)")
    if not ev.model and Stage.export not in cfg.stages and not os.path.isfile(os.path.join(source, "config.json")):
        found.problem_unless_dry_run(
            f"stages has evaluation but {source} holds no exported model: add export to stages "
            "(stages=[export,evaluation]), or set evaluation.model to a Hugging Face directory"
        )
    gpus = cfg.cluster.gpus_per_node or sizes.local_gpus or sizes.gpus_per_node
    if sizes.spec is None or not gpus:
        return
    weights_gib = model_parameters(cfg) * DTYPE_BYTES.get(ev.dtype, 2) / 2**30
    node_gib = gpus * sizes.spec.memory_gib
    if weights_gib * OVERHEAD > node_gib:
        found.problem(
            f"evaluation: the model ({weights_gib:.0f} GiB of {ev.dtype} weights, about "
            f"{weights_gib * OVERHEAD:.0f} GiB with activations) does not fit one node ({gpus} x "
            f"{sizes.spec.memory_gib:.0f} GiB {sizes.spec.name}), where lm-eval runs: evaluate held-out loss at "
            "the run's layout with evaluation.blends and set evaluation.tasks=[] and evaluation.heldout=[]"
        )


# --------------------------------------------------------------------------- blends
def _blends(cfg: Config, sizes: Sizes, found: Findings) -> None:
    ev = cfg.evaluation
    names = [b.name for b in ev.blends]
    for blend in ev.blends:
        if not NAME.match(str(blend.name)):
            found.problem(f"evaluation.blends: name {blend.name!r} must be letters, digits, '.', '_' or '-'")
        if not blend.prefixes:
            found.problem(f"evaluation.blends: {blend.name} names no prefixes")
        missing = [p for p in blend.prefixes if not (os.path.exists(p + ".bin") and os.path.exists(p + ".idx"))]
        if missing:
            found.problem_unless_dry_run(
                f"evaluation.blends: {blend.name}: no .bin/.idx for {', '.join(missing)}; prepare them with the "
                "data_preparation stage or fix the prefixes"
            )
        if sizes.micro_batch_size and sizes.dp and sizes.global_batch_size:
            samples = blend.samples or eval_samples(cfg.training, sizes.global_batch_size)
            step = sizes.micro_batch_size * sizes.dp
            if samples % step:
                found.problem(
                    f"evaluation.blends: {blend.name} evaluates {samples} sequences, which do not split into "
                    f"microbatches of {sizes.micro_batch_size} on {sizes.dp} data-parallel ranks; set its samples "
                    f"to a multiple of {step}"
                )
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        found.problem(f"evaluation.blends: the name {', '.join(doubled)} is used twice; name each blend once")
    if ev.blends and Stage.training not in cfg.stages:
        run_dir = Path(cfg.results_dir) / str(cfg.run_name)
        if latest_checkpoint(str(run_dir / "checkpoints")) is None:
            found.problem_unless_dry_run(
                f"evaluation.blends: {run_dir} has no complete checkpoint to evaluate: check run_name (and "
                "results_dir), or add training to stages"
            )
