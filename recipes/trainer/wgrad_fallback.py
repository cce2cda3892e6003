"""A stand-in for apex's `fused_weight_gradient_mlp_cuda` where apex is not installed.

With gradient_accumulation_fusion, weight gradients are accumulated straight into the DDP gradient buffer
(`main_grad`) instead of being materialised and added afterwards: one GEMM with beta=1 per weight. The
Transformer Engine layers do this themselves; megatron-core's own linear layers (here: the output layer) call
apex's kernel. These two functions do the same with cuBLAS through torch, so the fusion (and the
`defer_embedding_wgrad_compute` that needs it) work without apex. The NeMo container has apex; there this
module is not used.

Like apex's kernel, the two functions record no autograd history. Inside a backward pass grad mode is off anyway,
but megatron's pipeline schedules call them again after the last backward, with grad mode on, to drain the output
layer's deferred weight gradients (`drain_embedding_wgrad_compute`), on inputs that still require grad (the final
norm's output). Recorded there, the in-place add hung a graph on the DDP gradient buffer that kept every drained
microbatch's output gradient alive, step after step: 17.7 GiB a step on the 70B proxy's last stage (PP2, 8
microbatches of seq 8192), until it ran out of memory at the fifth step."""

from __future__ import annotations

import sys
import types

import torch


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


@torch.no_grad()
def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (fp32) += grad_output^T @ total_input."""
    x, g = _as_2d(total_input), _as_2d(grad_output)
    try:
        product = torch.mm(g.t(), x, out_dtype=torch.float32)  # fp32 result straight from cuBLAS
    except (TypeError, NotImplementedError, RuntimeError):  # no mixed-precision mm here: upcast first
        product = torch.mm(g.t().float(), x.float())
    main_grad.add_(product)


@torch.no_grad()
def wgrad_gemm_accum_fp16(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (bf16/fp16) += grad_output^T @ total_input; cuBLAS accumulates in fp32 and adds in place."""
    x, g = _as_2d(total_input), _as_2d(grad_output)
    main_grad.addmm_(g.t(), x)


def install() -> bool:
    """Register the stand-in under apex's module name unless the real one imports. Returns True when the
    stand-in is in use. megatron's tensor-parallel layers look for the module once, at import, and keep the
    answer in two globals: when they were imported first (a process that imported megatron before training
    code ran), those globals are set too."""
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401

        return False
    except ImportError:
        pass
    module = types.ModuleType("fused_weight_gradient_mlp_cuda")
    # A module's attributes are set through its namespace: ModuleType declares none of these names.
    vars(module).update(wgrad_gemm_accum_fp32=wgrad_gemm_accum_fp32, wgrad_gemm_accum_fp16=wgrad_gemm_accum_fp16)
    sys.modules["fused_weight_gradient_mlp_cuda"] = module
    layers = sys.modules.get("megatron.core.tensor_parallel.layers")
    if layers is not None:
        vars(layers).update(fused_weight_gradient_mlp_cuda=module, _grad_accum_fusion_available=True)
    return True
