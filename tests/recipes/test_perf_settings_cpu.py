"""The single-GPU performance keys on the training side, on the CPU: the megatron-core TransformerConfig each key
produces (built for real, with megatron-core's own validation), the combinations the plan refuses being ones
megatron-core refuses too, the rank order reaching megatron-core's parallel state (gloo ranks), and the CUDA-graph
component's decisions (when to capture, which schedule evaluation uses, what is released)."""

from __future__ import annotations

import dataclasses
import warnings

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer import TransformerConfig
import pytest
import torch

from launcher.config.compose import compose
from launcher.plan.build import build_plan
from recipes.trainer import graphs, settings

from cpu_megatron import run_ranks

FULL_RECOMPUTE = [
    "parallelism.recompute_granularity=full",
    "parallelism.recompute_method=uniform",
    "parallelism.recompute_num_layers=1",
]
# megatron-core checks that Transformer Engine's RoPE kernel imports, and Transformer Engine needs a GPU.
NO_TE = {"apply_rope_fusion": False}


def config_kwargs(*overrides: str) -> dict:
    cfg = compose([*overrides, "memory_check=false"])
    return {**settings.transformer_config_kwargs(cfg, build_plan(cfg), grad_accum_fusion=False), **NO_TE}


def config_for(*overrides: str):
    """(TransformerConfig, the warnings building it raised) for a composed and planned config, built as the
    trainer builds it."""
    kwargs = config_kwargs(*overrides)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = settings.make_transformer_config(kwargs)
    return config, [str(w.message) for w in caught]


def test_defaults_give_transformer_engines_loss_with_one_tensor_parallel_rank_and_no_warning():
    config, caught = config_for()
    assert config.cross_entropy_loss_fusion and config.cross_entropy_fusion_impl == "te"
    assert not any("stability issues" in w for w in caught)
    assert not any("full scope is deprecated" in w for w in caught)
    assert config.cuda_graph_impl == "none" and not config.use_te_rng_tracker
    assert not config.use_transformer_engine_op_fuser and not config.use_te_activation_func
    assert config.bias_activation_fusion


def test_the_trainer_hides_only_megatrons_warning_about_the_te_loss():
    # megatron-core itself still warns (the trainer's filter is what hides it), and the filter is gone afterwards.
    kwargs = config_kwargs()
    assert kwargs["cross_entropy_fusion_impl"] == "te"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        settings.make_transformer_config(kwargs)
        TransformerConfig(**kwargs)
    assert sum(settings.TE_LOSS_WARNING in str(w.message) for w in caught) == 1


def test_the_loss_fusion_key():
    native, _ = config_for("training.model.cross_entropy_fusion=native")
    assert native.cross_entropy_loss_fusion and native.cross_entropy_fusion_impl == "native"
    none, _ = config_for("training.model.cross_entropy_fusion=none")
    assert not none.cross_entropy_loss_fusion


def test_a_deterministic_run_takes_the_loss_kernel_with_one_fixed_reduction_order():
    # The native fusion's compiled kernels gave two processes of the same step different logit gradients (see
    # docs/training.md#deterministic-runs); a deterministic run takes Transformer Engine's kernel instead.
    deterministic, _ = config_for("training.deterministic=true")
    assert deterministic.cross_entropy_loss_fusion and deterministic.cross_entropy_fusion_impl == "te"
    assert deterministic.deterministic_mode
    asked, _ = config_for("training.deterministic=true", "training.model.cross_entropy_fusion=native")
    assert asked.cross_entropy_fusion_impl == "te"
    unfused, _ = config_for("training.deterministic=true", "training.model.cross_entropy_fusion=none")
    assert not unfused.cross_entropy_loss_fusion  # another kernel the user chose stays


def test_fp8_on_one_gpu_keeps_bf16_weights_and_the_cast_keys_reach_megatron():
    config, _ = config_for("dtype=fp8")
    assert config.fp8 == "hybrid" and config.fp8_recipe == "delayed" and not config.fp8_param
    assert not config.fp8_dot_product_attention and not config.fp8_output_proj
    fused, _ = config_for("dtype=fp8", "dtype.te_op_fuser=true")
    assert fused.use_transformer_engine_op_fuser
    assert settings.layer_spec_kwargs(fused) == {"use_te_op_fuser": True, "use_te_activation_func": False}
    act, _ = config_for("dtype=fp8", "dtype.te_activation_func=true")
    # megatron-core's fused bias-SwiGLU and Transformer Engine's activation exclude each other.
    assert act.use_te_activation_func and not act.bias_activation_fusion
    assert settings.layer_spec_kwargs(act) == {"use_te_op_fuser": False, "use_te_activation_func": True}
    weights, _ = config_for("dtype=fp8", "dtype.fp8_param_gather=true", "dtype.fp8_dot_product_attention=true")
    assert weights.fp8_param and weights.fp8_dot_product_attention
    blockwise, _ = config_for("dtype=fp8", "dtype.fp8_recipe=blockwise")
    assert blockwise.fp8_recipe == "blockwise"
    several, _ = config_for("training=llama31/8b", "dtype=fp8", "cluster=bcm", "dry_run=true")
    assert several.fp8_param  # CP2 x DP4 shards: FP8 weights in the all-gather


def test_blackwell_recipes_reach_megatron():
    mxfp8, _ = config_for(
        "dtype=fp8",
        "dtype.fp8_recipe=mxfp8",
        "dtype.fp8_output_layer=true",
        "cluster=bcm",
        "cluster.gpu_type=b200",
        "dry_run=true",
    )
    assert mxfp8.fp8_recipe == "mxfp8" and mxfp8.fp8_output_proj and mxfp8.fp4 is None
    nvfp4, _ = config_for("dtype=nvfp4", "cluster=bcm", "cluster.gpu_type=gb200", "dry_run=true")
    assert (nvfp4.fp4, nvfp4.fp4_recipe, nvfp4.fp8) == ("e2m1", "nvfp4", None) and not nvfp4.fp8_param


@pytest.mark.parametrize("mode,impl", [("per_layer", "transformer_engine"), ("full_iteration", "full_iteration")])
def test_cuda_graph_modes_reach_megatron(mode, impl):
    config, caught = config_for(f"training.cuda_graphs={mode}", "training.cuda_graph_warmup_steps=2")
    assert config.cuda_graph_impl == impl and config.cuda_graph_modules == []  # the whole layer
    assert config.cuda_graph_warmup_steps == 2 and config.use_te_rng_tracker
    assert not any("deprecated" in w for w in caught)


@pytest.mark.parametrize(
    "table,megatron_class",
    [
        (settings.TRANSFORMER_FIELDS, TransformerConfig),
        (settings.DDP_FIELDS, DistributedDataParallelConfig),
        (settings.OPTIMIZER_FIELDS, OptimizerConfig),
    ],
)
def test_every_mapped_field_is_a_field_of_megatrons_dataclass(table, megatron_class):
    # A field megatron-core renamed or removed would otherwise surface only as a TypeError on the GPUs.
    assert sorted(set(table) - {f.name for f in dataclasses.fields(megatron_class)}) == []


def _megatron_refuses(overrides: list[str], plan_overrides: dict) -> str:
    """megatron-core's own error for a config the plan refused, built past the plan (its fields set as the plan
    would have set them)."""
    kwargs = {**config_kwargs(*overrides), **plan_overrides}
    with pytest.raises((AssertionError, ValueError)) as err:
        TransformerConfig(**kwargs)
    return str(err.value)


def test_what_the_plan_refuses_megatron_refuses_too():
    assert "full recompute is only supported with full iteration CUDA graph" in _megatron_refuses(
        ["training.cuda_graphs=per_layer", *FULL_RECOMPUTE], {}
    )
    assert "fp8_output_proj requires fp8_recipe='mxfp8'" in _megatron_refuses(["dtype=fp8"], {"fp8_output_proj": True})
    assert "fp4 and fp8 cannot be used simultaneously" in _megatron_refuses(["dtype=fp8"], {"fp4": "e2m1"})
    # And what the plan accepts, megatron-core accepts.
    config_for("training.cuda_graphs=full_iteration", *FULL_RECOMPUTE)
    config_for("training.cuda_graphs=per_layer", "parallelism.recompute_granularity=selective")


# ----------------------------------------------------------------------------- rank order, on gloo ranks
def _groups(rank: int, plan_json: dict) -> dict:
    from megatron.core import parallel_state as ps

    from common.plan import Plan
    from recipes.trainer import distributed

    try:
        distributed.initialize_model_parallel(Plan(**plan_json))
    except AssertionError as err:  # megatron-core's own refusal, for the test to read
        return {"refused": str(err)}
    return {
        "dp": torch.distributed.get_process_group_ranks(ps.get_data_parallel_group()),
        "pp": torch.distributed.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
    }


def _plan_json(*overrides: str) -> dict:
    cfg = compose(
        [
            "parallelism=custom",
            "parallelism.num_gpus=4",
            "training.global_batch_size=16",
            "cluster=bcm",
            "dry_run=true",
            "memory_check=false",
            *overrides,
        ]
    )
    return build_plan(cfg).to_json_dict()


@pytest.mark.slow
def test_the_rank_order_reaches_megatrons_parallel_state():
    default = run_ranks(_groups, 4, _plan_json("parallelism.pp=2"))
    # tp-cp-ep-dp-pp: data-parallel peers are neighbours, pipeline peers half the world apart.
    assert [r["dp"] for r in default] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["pp"] for r in default] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    dp_last = run_ranks(_groups, 4, _plan_json("parallelism.pp=2", "parallelism.rank_order=dp_last"))
    # tp-cp-ep-pp-dp: pipeline peers are neighbours, data-parallel groups span the halves.
    assert [r["dp"] for r in dp_last] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["pp"] for r in dp_last] == [[0, 1], [0, 1], [2, 3], [2, 3]]


@pytest.mark.slow
def test_megatron_refuses_dp_last_with_pipeline_and_context_parallelism_as_the_plan_does():
    plan = _plan_json("parallelism.pp=2", "parallelism.cp=2")
    plan["rank_order"] = "tp-cp-ep-pp-dp"  # past the plan, which refuses it
    results = run_ranks(_groups, 4, plan)
    assert all("pp-last rank ordering" in r.get("refused", "") for r in results), results


# ----------------------------------------------------------------------------- the CUDA-graph component
class FakeHelper:
    def __init__(self, log):
        self.log, self.finished, self.created = log, False, False

    def capture_finished(self):
        return self.finished

    def graphs_created(self):
        return self.created

    def create_cudagraphs(self):
        self.log.append("capture")
        self.finished = self.created = True

    def cuda_graph_set_manual_hooks(self):
        self.log.append("manual hooks")

    def delete_cuda_graphs(self):
        self.log.append("delete")
        self.created = False


class FakeChunk:
    def __init__(self, log):
        self.log = log

    def disable_forward_pre_hook(self, param_sync=True):
        self.log.append(f"hooks off (sync={param_sync})")

    def enable_forward_pre_hook(self):
        self.log.append("hooks on")


def _per_layer(log, overlap=True, warmup=2):
    helper = FakeHelper(log)
    component = graphs.CudaGraphs(
        "per_layer",
        warmup,
        [FakeChunk(log)],
        overlap_param_gather=overlap,
        helper_factory=lambda: helper,
        say=lambda line: log.append(line),
    )
    return component, helper


def test_per_layer_graphs_are_captured_once_after_the_warmup_steps_of_this_process():
    log = []
    component, helper = _per_layer(log)
    eager = object()
    assert component.training_schedule(eager) is eager  # the layers replay their graphs themselves
    for _ in range(5):
        component.step_starts(0)
        log.append("step")
        component.step_ends(0)
    # Two eager steps, then the capture with the all-gather hooks off (no sync), back on, and the manual hooks.
    assert log == [
        "step",
        "step",
        "hooks off (sync=False)",
        "capture",
        "hooks on",
        "manual hooks",
        "CUDA graphs: per-layer graphs captured after 2 eager steps",
        "step",
        "step",
        "step",
    ]
    component.release()
    component.release()  # idempotent: the loop's finally may meet graphs already gone
    assert log[-1] == "delete" and log.count("delete") == 1


def test_without_overlapped_param_gather_there_are_no_hooks_to_move():
    log = []
    component, _ = _per_layer(log, overlap=False, warmup=1)
    for _ in range(2):
        component.step_starts(0)
        component.step_ends(0)
    assert "capture" in log and not any("hooks" in line for line in log)


def test_full_iteration_wraps_only_the_training_schedule_and_is_reset_before_teardown():
    log = []

    class Wrapper:
        def __init__(self, fn):
            self.fn = fn

        def reset_cuda_graph(self):
            log.append("reset")

    eager = object()
    component = graphs.CudaGraphs("full_iteration", 3, [], wrapper_factory=Wrapper, say=log.append)
    train = component.training_schedule(eager)
    assert isinstance(train, Wrapper) and train.fn is eager
    for _ in range(4):
        component.step_starts(0)
        component.step_ends(0)
    assert log == ["CUDA graphs: full-iteration graph captured after 3 eager steps"]
    component.release()
    assert log[-1] == "reset"


def test_no_graphs_change_nothing():
    eager = object()
    component = graphs.CudaGraphs(
        "none",
        3,
        [],
        helper_factory=lambda: pytest.fail("no helper"),
        wrapper_factory=lambda fn: pytest.fail("no wrapper"),
    )
    assert component.training_schedule(eager) is eager
    component.step_starts(0)
    component.step_ends(0)
    component.release()


def test_evaluation_runs_the_eager_schedule_and_training_the_graphed_one():
    from recipes.trainer.steps import Steps

    calls = []
    steps = Steps.__new__(Steps)  # only the schedule choice: no model, optimizer or data
    steps.schedule = lambda **kw: calls.append(("eager", kw["forward_only"]))
    steps.training_schedule = lambda **kw: calls.append(("graphed", kw["forward_only"]))
    steps.chunks = [object()]
    steps.plan = type("P", (), {"seq_length": 8, "micro_batch_size": 1})()
    steps._run_schedule(None, 2, forward_only=True)
    steps._run_schedule(None, 2, forward_only=False)
    assert calls == [("eager", True), ("graphed", False)]


def test_dtype_fp32_gives_megatron_fp32_weights_activations_and_optimizer():
    bf16, _ = config_for()
    fp32, _ = config_for("dtype=fp32")
    assert bf16.bf16 and bf16.params_dtype == torch.bfloat16 and bf16.autocast_dtype == torch.bfloat16
    assert not fp32.bf16 and not fp32.fp16
    assert fp32.params_dtype == fp32.pipeline_dtype == fp32.autocast_dtype == torch.float32
    cfg = compose(["dtype=fp32", "memory_check=false"])
    optimizer = settings.optimizer_config(cfg, build_plan(cfg))
    assert not optimizer.bf16 and optimizer.params_dtype == torch.float32
