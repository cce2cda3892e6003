"""The plan: every size the job needs, derived once from the resolved config and validated before anything is
written. The recipes read plan.json and never re-derive these numbers."""
from __future__ import annotations

import os
from typing import Any, Mapping

from common.plan import Plan
from launcher.plan.checks.init_weights import init_problems
from launcher.plan.env import training_env
from launcher.plan.errors import PlanError
from launcher.plan.formulas import (layer_parameters, layers_per_pipeline_stage, model_flops_per_sample,
                                    padded_vocab_size, pipeline_split_problems)
from launcher.plan.hardware import GpuSpec, LocalGpus, gpu_spec
from launcher.plan.memory import estimate_memory_gib


def _is_local_path(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or os.path.exists(path)


def _eval_problems(val_samples: Any, mbs: int, dp: int, num_microbatches: int, pp: int, vp: int | None
                   ) -> list[str]:
    """training.val_samples: whole microbatches on every data-parallel rank, read in schedule calls of at most
    num_microbatches each; the interleaved pipeline needs every call's count divisible by pp."""
    if val_samples is None:
        return []
    if not isinstance(val_samples, int) or isinstance(val_samples, bool) or val_samples < 1:
        return [f"training.val_samples={val_samples!r} must be null or a positive integer"]
    per_rank = mbs * dp
    if val_samples % per_rank:
        return [f"training.val_samples={val_samples} is not a multiple of training.micro_batch_size={mbs} x "
                f"data-parallel size {dp}; use a multiple of {per_rank}"]
    last_call = (val_samples // per_rank) % num_microbatches
    if vp and last_call % pp:
        return [f"training.val_samples={val_samples} leaves a last evaluation call of {last_call} microbatch(es) per "
                f"rank, which the interleaved pipeline cannot run (it needs a multiple of parallelism.pp={pp}); use a "
                f"multiple of {per_rank * pp}"]
    return []


def _blend_prefixes(blend: Any) -> list[str] | None:
    """The prefixes of a blend, [prefix, ...] or [weight, prefix, weight, prefix, ...]; None for anything else."""
    if not isinstance(blend, (list, tuple)) or not blend:
        return None
    if all(isinstance(x, str) for x in blend):
        return list(blend)
    if len(blend) % 2 == 0 and all(isinstance(w, (int, float)) and isinstance(p, str)
                                   for w, p in zip(blend[::2], blend[1::2])):
        return list(blend[1::2])
    return None


def missing_data(cfg: Mapping[str, Any]) -> list[str]:
    """One line per blend (training.data.blend, valid_blend) whose .bin/.idx files are not there (real data)."""
    data = cfg["training"]["data"]
    if data.get("mock"):
        return []
    lines = []
    for key in ("blend", "valid_blend"):
        missing = [p for p in _blend_prefixes(data.get(key)) or []
                   if not (os.path.exists(p + ".bin") and os.path.exists(p + ".idx"))]
        if missing:
            lines.append(f"training.data.{key}: no .bin/.idx for {', '.join(missing)}; run the data_preparation "
                         "stage first or fix the prefixes")
    return lines


def _data_problems(cfg: Mapping[str, Any], data_will_be_prepared: bool) -> list[str]:
    data = cfg["training"]["data"]
    tokenizer = cfg["training"]["tokenizer"]
    problems = []
    if data.get("mock"):
        return problems
    blend = data.get("blend")
    if not blend:
        return ["training.data.mock=false needs training.data.blend: [weight, prefix, ...] or [prefix, ...] "
                "from data preparation"]
    if _blend_prefixes(blend) is None:
        return [f"training.data.blend must be [weight, prefix, weight, prefix, ...] or [prefix, ...]; got {blend}"]
    valid = data.get("valid_blend")
    if valid is not None and _blend_prefixes(valid) is None:
        return [f"training.data.valid_blend must be null or [prefix, ...] (read in order); got {valid}"]
    if not data_will_be_prepared:
        problems += missing_data(cfg)
    kind, path = tokenizer.get("type"), tokenizer.get("path")
    if kind not in ("huggingface", "sentencepiece"):
        problems.append(f"training.tokenizer.type={kind!r}: use huggingface or sentencepiece")
    elif not path:
        problems.append("training.tokenizer.path is empty: a hub id, a local tokenizer directory or a .model file")
    elif (kind == "sentencepiece" or _is_local_path(path)) and not os.path.exists(os.path.expanduser(path)):
        problems.append(f"training.tokenizer.path={path} does not exist (run setup.sh to download the tokenizer)")
    return problems


def _cluster_shape(cfg: Mapping[str, Any], num_gpus: int, local_gpus: LocalGpus | None
                   ) -> tuple[int, int, str | None, str | None, list[str]]:
    """(gpus_per_node, num_nodes, gpu_type, cannot_train_reason, problems)."""
    cluster = cfg["cluster"]
    problems: list[str] = []
    reason = None
    gpu_type = cluster.get("gpu_type")
    if cluster["platform"] == "local":
        local = local_gpus or LocalGpus(0, None, ())
        available = cluster.get("gpus_per_node") or local.count
        gpu_type = gpu_type or local.gpu_type
        if cluster.get("gpus_per_node") and cluster["gpus_per_node"] > local.count:
            problems.append(f"cluster.gpus_per_node={cluster['gpus_per_node']} but this machine has "
                            f"{local.count} GPUs; set cluster.gpus_per_node=null to use what nvidia-smi finds")
            return num_gpus, 1, gpu_type, reason, problems
        if local.count == 0:
            reason = ("no NVIDIA GPU is visible on this machine (nvidia-smi found none), so cluster=local "
                      "cannot train here")
            return num_gpus, 1, gpu_type, reason, problems
        if num_gpus > available:
            problems.append(f"parallelism.num_gpus={num_gpus} but this machine has {available} GPUs; set "
                            f"parallelism.num_gpus={available} (and a layout that fits) or use cluster=bcm")
        return num_gpus, 1, gpu_type, reason, problems

    gpus_per_node = cluster.get("gpus_per_node")
    tasks = cluster.get("ntasks_per_node") or gpus_per_node
    if not tasks:
        problems.append("cluster.gpus_per_node is null (no GRES): set cluster.ntasks_per_node to the GPUs per node")
        return num_gpus, 1, gpu_type, reason, problems
    if gpus_per_node and tasks > gpus_per_node:
        problems.append(f"cluster.ntasks_per_node={tasks} asks for more GPUs per node than the nodes have "
                        f"(cluster.gpus_per_node={gpus_per_node}); set cluster.ntasks_per_node=null (one task per "
                        "GPU)")
    per_node = min(tasks, num_gpus)
    if num_gpus % per_node:
        problems.append(f"parallelism.num_gpus={num_gpus} is not a whole number of nodes of {per_node} GPUs "
                        f"(cluster.gpus_per_node); use a multiple of {per_node}")
    return per_node, max(1, num_gpus // per_node), gpu_type, reason, problems


def build_plan(cfg: Mapping[str, Any], local_gpus: LocalGpus | None = None) -> Plan:
    """Derive and validate. Raises PlanError listing every problem found (one line each)."""
    model = cfg["training"]["model"]
    train = cfg["training"]
    par = cfg["parallelism"]
    dtype = cfg["dtype"]
    problems: list[str] = []

    if par.get("auto") is not None:
        raise PlanError(["parallelism=auto is a search, not a layout: main.py replaces it with the layout it picks "
                         "(parallelism.auto.pick) before planning"])
    tp, pp, cp = par["tp"], par["pp"], par["cp"]
    vp = par.get("vp")
    num_gpus = par["num_gpus"]
    for key, value in (("tp", tp), ("pp", pp), ("cp", cp), ("num_gpus", num_gpus)):
        if not isinstance(value, int) or value < 1:
            raise PlanError([f"parallelism.{key}={value!r} must be a positive integer"])
    if vp is not None and (not isinstance(vp, int) or vp < 1):
        raise PlanError([f"parallelism.vp={vp!r} must be null or a positive integer"])
    if vp == 1:
        vp = None
    if vp and pp == 1:
        problems.append(f"parallelism.vp={vp} (interleaved pipeline) needs parallelism.pp > 1; set vp=null")
        vp = None

    # Tensor parallel: heads, KV groups and the FFN must split evenly.
    heads, groups = model["num_attention_heads"], model["num_query_groups"]
    if heads % tp or groups % tp or model["ffn_hidden_size"] % tp:
        good = [t for t in (1, 2, 4, 8, 16) if heads % t == 0 and groups % t == 0 and model["ffn_hidden_size"] % t == 0]
        problems.append(f"parallelism.tp={tp} must divide training.model.num_attention_heads={heads} and "
                        f"training.model.num_query_groups={groups}; use tp in {good}")
    if heads % groups:
        problems.append(f"training.model.num_attention_heads={heads} must be a multiple of "
                        f"training.model.num_query_groups={groups}")
    if par["sequence_parallel"] and tp == 1:
        problems.append("parallelism.sequence_parallel=true needs parallelism.tp > 1; set it to false")
    if par["tp_comm_overlap"] and not (par["sequence_parallel"] and tp > 1):
        problems.append("parallelism.tp_comm_overlap=true needs parallelism.sequence_parallel=true and tp > 1")

    # Pipeline split.
    problems += pipeline_split_problems(model["num_layers"], pp, vp, par["asymmetric_pipeline"])
    asymmetric = bool(par["asymmetric_pipeline"])

    # Sequence: CP halves it into 2*cp load-balanced chunks; SP splits each CP shard over TP.
    seq = train["seq_length"]
    if cp > 1:
        if seq % (2 * cp):
            problems.append(f"training.seq_length={seq} must be divisible by 2 x parallelism.cp={2 * cp}")
        if model["attention_backend"] == "unfused":
            problems.append("parallelism.cp > 1 needs Transformer Engine fused or flash attention; set "
                            "training.model.attention_backend=auto")
    if par["cp_comm_type"] not in ("p2p", "a2a", "allgather", "a2a+p2p"):
        problems.append(f"parallelism.cp_comm_type={par['cp_comm_type']!r}: use p2p, a2a, allgather or a2a+p2p")
    if par["sequence_parallel"] and tp > 1 and (seq // max(cp, 1)) % tp:
        problems.append(f"training.seq_length / parallelism.cp = {seq // cp} must be divisible by parallelism.tp={tp} "
                        "for sequence parallelism")
    if model["attention_backend"] not in ("auto", "fused", "flash", "unfused"):
        problems.append(f"training.model.attention_backend={model['attention_backend']!r}: use auto, fused, flash "
                        "or unfused")

    # Data parallel and batch.
    model_parallel = tp * pp * cp
    dp = num_gpus // model_parallel if num_gpus % model_parallel == 0 else 0
    if not dp:
        problems.append(f"parallelism.num_gpus={num_gpus} is not a multiple of tp x pp x cp = {model_parallel}")
        dp = 1
    mbs, gbs = train["micro_batch_size"], train["global_batch_size"]
    if mbs < 1 or gbs < 1:
        problems.append("training.micro_batch_size and training.global_batch_size must be positive")
        mbs, gbs = max(mbs, 1), max(gbs, 1)
    if gbs % (mbs * dp):
        problems.append(f"training.global_batch_size={gbs} is not divisible by training.micro_batch_size={mbs} x "
                        f"data-parallel size {dp} (= num_gpus {num_gpus} / (tp {tp} x pp {pp} x cp {cp})); "
                        f"use a multiple of {mbs * dp}")
    num_microbatches = max(1, gbs // (mbs * dp))
    if vp and num_microbatches < pp:
        problems.append(f"the interleaved pipeline needs at least parallelism.pp={pp} microbatches per step; "
                        f"training.global_batch_size={gbs} gives {num_microbatches}")

    problems += _eval_problems(train.get("val_samples"), mbs, dp, num_microbatches, pp, vp)

    # Precision.
    fp8 = dtype.get("fp8")
    if fp8 not in (None, "hybrid", "e4m3"):
        problems.append(f"dtype.fp8={fp8!r}: use hybrid, e4m3 or null")
    if fp8 and dtype.get("fp8_recipe") not in ("delayed", "tensorwise"):
        problems.append(f"dtype.fp8_recipe={dtype.get('fp8_recipe')!r}: use delayed or tensorwise")
    fp8_param_gather = bool(dtype.get("fp8_param_gather"))
    if fp8_param_gather and not fp8:
        problems.append("dtype.fp8_param_gather=true needs dtype.fp8 (use dtype=fp8)")
    if fp8_param_gather and not par["use_distributed_optimizer"]:
        problems.append("dtype.fp8_param_gather=true needs parallelism.use_distributed_optimizer=true")
    if par["overlap_param_gather"] and not par["use_distributed_optimizer"]:
        problems.append("parallelism.overlap_param_gather=true needs parallelism.use_distributed_optimizer=true")
    if par["defer_embedding_wgrad_compute"] and pp == 1:
        problems.append("parallelism.defer_embedding_wgrad_compute=true needs parallelism.pp > 1")
    if par.get("recompute_granularity") not in (None, "selective", "full"):
        problems.append(f"parallelism.recompute_granularity={par['recompute_granularity']!r}: use null, selective "
                        "or full")
    if par.get("recompute_granularity") == "full" and par.get("recompute_method") not in ("uniform", "block"):
        problems.append("parallelism.recompute_granularity=full needs parallelism.recompute_method=uniform|block "
                        "and parallelism.recompute_num_layers")

    # Schedule.
    if train["train_steps"] < 1:
        problems.append(f"training.train_steps={train['train_steps']} must be positive")
    decay = train["scheduler"].get("decay_steps") or train["train_steps"]
    if train["scheduler"]["warmup_steps"] >= decay:
        problems.append(f"training.scheduler.warmup_steps={train['scheduler']['warmup_steps']} must be smaller than "
                        f"the decay horizon {decay} (training.scheduler.decay_steps, or train_steps when null)")
    if train["optimizer"]["min_lr"] > train["optimizer"]["lr"]:
        problems.append("training.optimizer.min_lr must not exceed training.optimizer.lr")

    # A dry run only warns about data that is not there yet (launcher.cli).
    problems += _data_problems(cfg, data_will_be_prepared=("data_preparation" in cfg["stages"]
                                                           or bool(cfg.get("dry_run"))))

    gpus_per_node, num_nodes, gpu_type, cannot_train, cluster_problems = _cluster_shape(cfg, num_gpus, local_gpus)
    problems += cluster_problems
    problems += init_problems(cfg, num_nodes)
    spec: GpuSpec | None = None
    if gpu_type:
        try:
            spec = gpu_spec(gpu_type)
        except KeyError as err:
            problems.append(str(err.args[0]))
    if fp8 and spec is not None and spec.fp8_peak_flops is None:
        problems.append(f"dtype=fp8 needs FP8 tensor cores (Hopper or newer); cluster.gpu_type={gpu_type} has none; "
                        "use dtype=bf16")
    if tp > gpus_per_node and cfg["cluster"]["platform"] != "local":
        problems.append(f"parallelism.tp={tp} spans nodes (cluster.gpus_per_node={gpus_per_node}); keep TP within a node")

    if problems:
        raise PlanError(problems)

    stage_layers = layers_per_pipeline_stage(model["num_layers"], pp, asymmetric)
    vocab = padded_vocab_size(model["vocab_size"], model["make_vocab_size_divisible_by"], tp)
    flops = model_flops_per_sample(model, seq)
    memory = estimate_memory_gib(
        model, tp=tp, pp=pp, cp=cp, dp=dp, vp=vp, stage_layers=stage_layers, padded_vocab=vocab,
        seq_length=seq, micro_batch_size=mbs, distributed_optimizer=par["use_distributed_optimizer"],
        grad_fp32=par["grad_reduce_in_fp32"], fp8_params=fp8_param_gather,
        recompute=par.get("recompute_granularity"))
    # The estimate is rough but a layout far beyond the GPU's memory is a misconfiguration, not a tuning
    # question: fail here rather than after the queue wait. memory_check=false accepts the risk.
    if spec is not None and memory > spec.memory_gib and cfg.get("memory_check", True):
        problems.append(f"estimated {memory} GiB per GPU exceeds the {spec.memory_gib} GiB of cluster.gpu_type="
                        f"{spec.name} with parallelism.tp={tp} pp={pp} cp={cp} on {num_gpus} GPUs: use more model "
                        "parallelism (parallelism=<layout>, parallelism.num_gpus), "
                        "parallelism.recompute_granularity=full, or memory_check=false")
        raise PlanError(problems)
    peak_kind = "fp8" if fp8 else "bf16"
    peak = None if spec is None else (spec.fp8_peak_flops if fp8 else spec.bf16_peak_flops)
    return Plan(
        model=train["name"], dtype=dtype["name"], num_gpus=num_gpus, num_nodes=num_nodes,
        gpus_per_node=gpus_per_node, tp=tp, pp=pp, cp=cp, vp=vp, dp=dp,
        sequence_parallel=bool(par["sequence_parallel"]), micro_batch_size=mbs, global_batch_size=gbs,
        num_microbatches=num_microbatches, seq_length=seq, layers_per_pipeline_stage=stage_layers,
        asymmetric_pipeline=asymmetric, fp8=fp8, fp8_param_gather=fp8_param_gather,
        tp_comm_overlap=bool(par["tp_comm_overlap"]), model_flops_per_sample=flops,
        est_memory_gib_per_gpu=memory, padded_vocab_size=vocab,
        num_parameters=model["num_layers"] * layer_parameters(model) + 2 * model["vocab_size"] * model["hidden_size"]
        + model["hidden_size"],
        gpu_type=gpu_type, peak_flops_per_gpu=peak, peak_flops_kind=peak_kind,
        env=training_env(par, cfg["cluster"]),
        cannot_train_reason=cannot_train,
    )
