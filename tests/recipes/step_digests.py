"""One training step of a run directory in this process, with a digest of every tensor it computes, in the order it
computes them: each module's forward outputs, the gradients flowing into each module's outputs and inputs, and
every parameter's accumulated gradient. Two processes that ran the same deterministic step must write the same
file; where they do not, the first differing entry names the kernel that differs.

    python tests/recipes/step_digests.py RUN_DIR OUT.json        (a world of one rank; MASTER_PORT to choose)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from recipes.trainer import wgrad_fallback  # noqa: E402 - before megatron is imported

wgrad_fallback.install()

import torch  # noqa: E402

from recipes.runtime.distributed import unwrap  # noqa: E402
from recipes.trainer.build import build_trainer  # noqa: E402


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha1(tensor.detach().contiguous().float().cpu().numpy().tobytes()).hexdigest()[:16]


def tensors(value) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors(item)]
    return []


def record_everything(chunks, forward: list, backward: list) -> None:
    for chunk in chunks:
        for name, module in unwrap(chunk).named_modules():
            if not name:
                continue

            def before(_module, args, name=name):
                for i, t in enumerate(tensors(args)):
                    if t.requires_grad and t.is_floating_point():
                        t.register_hook(lambda g, i=i: backward.append([f"{name} grad of input {i}", digest(g)]))

            def after(_module, _args, output, name=name):
                for i, t in enumerate(tensors(output)):
                    if t.is_floating_point():
                        forward.append([f"{name} output {i}", digest(t)])
                        if t.requires_grad:
                            t.register_hook(lambda g, i=i: backward.append([f"{name} grad of output {i}", digest(g)]))

            module.register_forward_pre_hook(before)
            module.register_forward_hook(after)


def main() -> None:
    run_dir, out = sys.argv[1], sys.argv[2]
    trainer = build_trainer(run_dir)
    steps = trainer.steps
    forward: list = []
    backward: list = []
    record_everything(steps.chunks, forward, backward)
    loss, grad_norm = steps.train_step()
    grads = [
        [name, digest(p.main_grad)]
        for chunk in steps.chunks
        for name, p in unwrap(chunk).named_parameters()
        if getattr(p, "main_grad", None) is not None
    ]
    Path(out).write_text(
        json.dumps({"loss": loss, "grad_norm": grad_norm, "forward": forward, "backward": backward, "grads": grads})
    )
    sys.stdout.flush()
    os._exit(0)  # the step is all this process is for: no teardown


if __name__ == "__main__":
    main()
