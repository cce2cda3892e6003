"""GPU facts the plan needs: dense peak FLOP/s (for MFU) and memory, by the name users write in cluster.gpu_type."""

from __future__ import annotations

from dataclasses import dataclass
import functools
import os
import shutil
import subprocess


@dataclass(frozen=True)
class GpuSpec:
    name: str
    bf16_peak_flops: float
    fp8_peak_flops: float | None  # None: no FP8 tensor cores
    memory_gib: float
    compute_capability: tuple[int, int]
    fp4_peak_flops: float | None = None  # None: no FP4 tensor cores

    @property
    def block_scaled(self) -> bool:
        """Tensor cores for block-scaled formats (MXFP8, NVFP4): compute capability 10.0 (Blackwell), as Transformer
        Engine's check_mxfp8_support / check_nvfp4_support require."""
        return self.compute_capability >= (10, 0)


# Dense (no sparsity) datasheet peaks, SXM parts.
GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("h100", 989e12, 1979e12, 79.6, (9, 0)),
    "h200": GpuSpec("h200", 989e12, 1979e12, 139.8, (9, 0)),
    "a100": GpuSpec("a100", 312e12, None, 79.2, (8, 0)),
    "b200": GpuSpec("b200", 2250e12, 4500e12, 178.4, (10, 0), 9000e12),
    "gb200": GpuSpec("gb200", 2500e12, 5000e12, 184.0, (10, 0), 10000e12),
}


def gpu_types_with(predicate) -> list[str]:
    """The cluster.gpu_type names whose spec satisfies `predicate`, for messages ("b200 or gb200")."""
    return [name for name, spec in GPUS.items() if predicate(spec)]


def gpu_spec(gpu_type: str) -> GpuSpec:
    key = gpu_type.lower()
    if key not in GPUS:
        raise KeyError(f"unknown cluster.gpu_type={gpu_type!r}; known: {', '.join(GPUS)}")
    return GPUS[key]


def gpu_type_from_name(device_name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; None when the name matches no known GPU."""
    lowered = device_name.lower()
    for key in sorted(GPUS, key=len, reverse=True):  # gb200 before b200
        if key in lowered:
            return key
    return None


@dataclass(frozen=True)
class LocalGpus:
    count: int
    gpu_type: str | None
    names: tuple[str, ...]


@functools.lru_cache(maxsize=None)  # once per process: a sweep asks for every point
def detect_local_gpus() -> LocalGpus:
    """GPUs visible on this machine, through nvidia-smi (the launcher never imports torch)."""
    if shutil.which("nvidia-smi") is None:
        return LocalGpus(0, None, ())
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return LocalGpus(0, None, ())
    names = tuple(line.strip() for line in out.splitlines() if line.strip())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # nvidia-smi ignores it; torchrun's processes will not
        ids = [i.strip() for i in visible.split(",") if i.strip()]
        if all(i.isdigit() for i in ids):
            names = tuple(names[int(i)] for i in ids if int(i) < len(names))
        else:  # GPU-/MIG- UUIDs: count them; the machine's GPUs are one model in practice
            names = names[: len(ids)]
    return LocalGpus(len(names), gpu_type_from_name(names[0]) if names else None, names)
