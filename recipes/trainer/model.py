"""Llama 3.1 as megatron-core GPTModel chunks with the Transformer Engine layer spec, wrapped for data parallel."""

from __future__ import annotations

from megatron.core import parallel_state as ps
from megatron.core.distributed import DistributedDataParallel
from megatron.core.enums import ModelType
from megatron.core.full_cuda_graph import get_shared_capture_stream
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
from megatron.core.tensor_parallel import set_defaults_if_not_set_tensor_model_parallel_attributes
import torch

from common.config import Config
from common.plan import Plan
from recipes.trainer import settings


def build_model_chunks(config, cfg: Config, plan: Plan) -> list[torch.nn.Module]:
    """One GPTModel per virtual pipeline stage held by this rank, on the current GPU."""
    spec = get_gpt_layer_with_transformer_engine_spec(**settings.layer_spec_kwargs(config))
    kwargs = settings.gpt_model_kwargs(cfg, plan)
    chunks = []
    for stage in range(plan.vp or 1):
        vp_stage = stage if plan.vp else None
        model = GPTModel(
            config,
            spec,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            vp_stage=vp_stage,
            **kwargs,
        )
        model.model_type = ModelType.encoder_or_decoder
        for param in model.parameters():
            set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        chunks.append(model.cuda(torch.cuda.current_device()))
    return chunks


def wrap_data_parallel(chunks: list[torch.nn.Module], config, ddp_config) -> list[torch.nn.Module]:
    def wrap():
        return [
            # Bucketing only on the first chunk: the others' grads become ready in bursts the schedule already
            # overlaps.
            DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=index > 0)
            for index, chunk in enumerate(chunks)
        ]

    if config.cuda_graph_impl != "full_iteration":
        return wrap()
    # A full-iteration graph is captured on megatron-core's shared capture stream; the gradient-accumulation nodes
    # DDP keeps must belong to that stream, or the capture meets them on a stream it does not capture.
    stream = get_shared_capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        wrapped = wrap()
    torch.cuda.current_stream().wait_stream(stream)
    return wrapped


def init_userbuffers(cfg: Config, plan: Plan) -> None:
    """Transformer Engine userbuffers for TP communication overlap; must run after model-parallel init and
    before the first forward."""
    # Transformer Engine is imported where it is used directly, not with this module: a rank without it
    # (stack_check=false) still reaches the one-line checks that run before the model is built.
    from transformer_engine.pytorch import UserBufferQuantizationMode, initialize_ub

    ub = settings.userbuffer_settings(cfg, plan)
    modes = [UserBufferQuantizationMode.FP8 if ub["fp8"] else UserBufferQuantizationMode.NONE]
    initialize_ub(
        shape=ub["shape"],
        tp_size=ub["tp_size"],
        quantization_modes=modes,
        dtype=torch.bfloat16,
        ub_cfgs=ub["ub_cfgs"],
        bootstrap_backend="nccl",
    )


def count_parameters(chunks: list[torch.nn.Module]) -> int:
    return sum(p.numel() for chunk in chunks for p in chunk.parameters())
