"""CUDA graphs of training steps (training.cuda_graphs), as one component the loop asks: which schedule function a
training step runs, when to capture, and when to let the graphs go.

- per_layer: Transformer Engine graphs of every decoder layer's forward and backward, one per microbatch in flight,
  captured through megatron-core's TECudaGraphHelper once `warmup_steps` steps have run eagerly in this process.
  The layers replay them only in training mode (GraphableMegatronModule._should_call_te_cudagraph), so evaluation
  runs eagerly; the parameter all-gather hooks they bypass are called by hand (cuda_graph_set_manual_hooks).
- full_iteration: megatron-core's FullCudaGraphWrapper around the training schedule: the forward and backward of
  every microbatch, the gradient reduce-scatter and the loss scaling in one graph, captured at its call number
  `warmup_steps`; the optimizer step stays outside. Evaluation keeps the plain schedule.

Why evaluation never runs in a graph. In megatron-core 0.19.2 a graph of the evaluation is either captured apart
(FullCudaGraphWrapper keeps a class-level 'validation' graph, captured at the N-th evaluation call with a barrier
on every rank, its call count shared by every wrapper in the process) or, with megatron-core's own per-layer graphs,
the training graphs are replayed under no_grad with their training-mode side effects. Graphs hold the NCCL
communicators of the collectives they captured; one captured by the last evaluation, after the training graphs
were released, outlives them into the process-group teardown, which then blocks: the hang after evaluation that
users of full-iteration and per-layer graphs report. Here no evaluation graph exists, and `release` drops every
graph before the process groups are destroyed, whatever ended the run (last step, stop signal, divergence,
error)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from recipes.runtime.callbacks import Callback, Stop


class CudaGraphs(Callback):
    """The trainer takes `training_schedule` once; as a callback the component captures at the start of the step
    after the eager warmup steps, counts the steps at their end, and releases the graphs when the run stops
    (before the process groups go)."""

    def __init__(
        self,
        mode: str,
        warmup_steps: int,
        chunks: Sequence[Any] = (),
        *,
        overlap_param_gather: bool = False,
        helper_factory: Callable[[], Any] | None = None,
        wrapper_factory: Callable[[Callable], Any] | None = None,
        say: Callable[[str], None] = print,
    ):
        self.mode = mode
        self.warmup_steps = warmup_steps
        self.chunks = list(chunks)
        self.overlap_param_gather = overlap_param_gather
        self.say = say
        self.steps_run = 0  # training steps this process ran (a resumed run warms up again)
        self._helper = helper_factory() if mode == "per_layer" and helper_factory else None
        self._wrapper_factory = wrapper_factory
        self._wrapper: Any | None = None  # the full-iteration graph wrapper, once training asked for it

    @classmethod
    def for_trainer(cls, plan, config, chunks, optimizer, overlap_param_gather: bool, say) -> "CudaGraphs":
        """The component for a run: megatron-core's helpers for its mode (none for training.cuda_graphs=none)."""
        mode, warmup = plan.cuda_graphs, config.cuda_graph_warmup_steps

        def helper():
            from megatron.core import num_microbatches_calculator as microbatches
            from megatron.core.transformer.cuda_graphs import TECudaGraphHelper
            import torch

            # The helper sizes its capture from megatron's global microbatch calculator, which this trainer
            # (which takes the microbatch count from the plan) does not otherwise set.
            if microbatches._GLOBAL_NUM_MICROBATCHES_CALCULATOR is None:
                microbatches.init_num_microbatches_calculator(
                    torch.distributed.get_rank(), None, plan.global_batch_size, plan.micro_batch_size, plan.dp
                )
            return TECudaGraphHelper(
                model=chunks,
                config=config,
                seq_length=plan.seq_length,
                micro_batch_size=plan.micro_batch_size,
                optimizers=[optimizer],
            )

        def wrapper(forward_backward):
            from megatron.core.full_cuda_graph import FullCudaGraphWrapper

            return FullCudaGraphWrapper(
                forward_backward,
                cuda_graph_warmup_steps=warmup,
                use_single_mempool=config.cuda_graph_use_single_mempool,
            )

        return cls(
            mode,
            warmup,
            chunks,
            overlap_param_gather=overlap_param_gather,
            helper_factory=helper,
            wrapper_factory=wrapper,
            say=say,
        )

    def training_schedule(self, forward_backward: Callable) -> Callable:
        """The schedule function training steps call (evaluation keeps `forward_backward`)."""
        if self.mode == "full_iteration" and self._wrapper_factory is not None:
            wrapper = self._wrapper_factory(forward_backward)
            self._wrapper = wrapper
            return wrapper
        return forward_backward

    def step_starts(self, step: int) -> None:
        """per_layer: capture before the first step after the eager warmup steps."""
        helper = self._helper
        if helper is None or helper.capture_finished() or self.steps_run != self.warmup_steps:
            return
        # As Megatron-LM does: no all-gather hooks while the capture's own warmup runs, then the hooks back plus
        # the manual ones the graphed layers call, since a replayed graph skips the modules' forward pre-hooks.
        if self.overlap_param_gather:
            for chunk in self.chunks:
                chunk.disable_forward_pre_hook(param_sync=False)
        helper.create_cudagraphs()
        if self.overlap_param_gather:
            for chunk in self.chunks:
                chunk.enable_forward_pre_hook()
            helper.cuda_graph_set_manual_hooks()
        self.say(f"CUDA graphs: per-layer graphs captured after {self.steps_run} eager steps")

    def step_ends(self, step: int) -> None:
        self.steps_run += 1
        if self.mode == "full_iteration" and self.steps_run == self.warmup_steps + 1:
            self.say(f"CUDA graphs: full-iteration graph captured after {self.warmup_steps} eager steps")

    def stops(self, stop: Stop) -> None:
        self.release()

    def release(self) -> None:
        """Drop every graph (and its hold on NCCL communicators) before the process groups are destroyed."""
        if self._helper is not None and self._helper.graphs_created():
            self._helper.delete_cuda_graphs()
        if self._wrapper is not None:
            self._wrapper.reset_cuda_graph()
            self._wrapper = None
