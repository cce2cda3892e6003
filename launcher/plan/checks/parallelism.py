"""parallelism: the layout's sizes and the rules between them and the model."""

from __future__ import annotations

from common.config import AttentionBackend, Config, ModelConfig, ParallelismConfig, RankOrder, Recompute
from launcher.plan.findings import Findings
from launcher.plan.formulas import pipeline_split_problems
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    par, model = cfg.parallelism, cfg.training.model
    if par.auto is not None:
        found.problem(
            "parallelism=auto is a search, not a layout: main.py replaces it with the layout it picks "
            "(parallelism.auto.pick) before planning"
        )
        return
    tp, pp, cp = sizes.tp, sizes.pp, sizes.cp
    # Every value is in its range (checks/ranges.py runs first), so the layout's sizes are all there.
    assert tp and pp and cp
    if (par.vp or 1) > 1 and pp == 1:
        found.problem(f"parallelism.vp={par.vp} (interleaved pipeline) needs parallelism.pp > 1; set vp=null")
    _tensor_parallel(par, model, tp, found)
    for line in pipeline_split_problems(model.num_layers, pp, sizes.vp, par.asymmetric_pipeline):
        found.problem(line)
    if cp > 1 and model.attention_backend == AttentionBackend.unfused:
        found.problem(
            "parallelism.cp > 1 needs Transformer Engine fused or flash attention; set "
            "training.model.attention_backend=auto"
        )
    if par.cp_comm_type not in ("p2p", "a2a", "allgather", "a2a+p2p"):
        found.problem(f"parallelism.cp_comm_type={par.cp_comm_type!r}: use p2p, a2a, allgather or a2a+p2p")
    if sizes.dp is None:
        found.problem(f"parallelism.num_gpus={par.num_gpus} is not a multiple of tp x pp x cp = {tp * pp * cp}")
    _optimizer_sharding(par, pp, found)
    _recompute(par, found)
    if par.rank_order == RankOrder.dp_last and pp > 1 and cp > 1:
        # megatron-core builds the expert grid without CP: with the data-parallel dimension last, its expert DP
        # (dp x cp) must equal the dense DP, which only holds for cp=1 (initialize_model_parallel asserts it).
        found.problem(
            f"parallelism.rank_order=dp_last with parallelism.pp={pp} and parallelism.cp={cp}: megatron-core "
            "accepts the data-parallel-last order only with pp=1 or cp=1; use rank_order=pp_last"
        )


def _tensor_parallel(par: ParallelismConfig, model: ModelConfig, tp: int, found: Findings) -> None:
    heads, groups, ffn = model.num_attention_heads, model.num_query_groups, model.ffn_hidden_size
    if min(heads, groups, ffn) >= 1 and (heads % tp or groups % tp or ffn % tp):
        good = [t for t in (1, 2, 4, 8, 16) if heads % t == 0 and groups % t == 0 and ffn % t == 0]
        found.problem(
            f"parallelism.tp={tp} must divide training.model.num_attention_heads={heads} and "
            f"training.model.num_query_groups={groups}; use tp in {good}"
        )
    if par.sequence_parallel and tp == 1:
        found.problem("parallelism.sequence_parallel=true needs parallelism.tp > 1; set it to false")
    if par.tp_comm_overlap and not (par.sequence_parallel and tp > 1):
        found.problem("parallelism.tp_comm_overlap=true needs parallelism.sequence_parallel=true and tp > 1")


def _optimizer_sharding(par: ParallelismConfig, pp: int, found: Findings) -> None:
    if par.overlap_param_gather and not par.use_distributed_optimizer:
        found.problem("parallelism.overlap_param_gather=true needs parallelism.use_distributed_optimizer=true")
    if par.defer_embedding_wgrad_compute and pp == 1:
        found.problem("parallelism.defer_embedding_wgrad_compute=true needs parallelism.pp > 1")


def _recompute(par: ParallelismConfig, found: Findings) -> None:
    if par.recompute_granularity == Recompute.full and not (par.recompute_method and par.recompute_num_layers):
        found.problem(
            "parallelism.recompute_granularity=full needs parallelism.recompute_method=uniform|block "
            "and parallelism.recompute_num_layers"
        )
