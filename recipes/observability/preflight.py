"""Network preflight, the `preflight` stage: `python -m recipes.preflight --run-dir RUN_DIR` on every rank of the
training job's shape (torchrun or srun start it, as for training).

All-reduces over all the job's GPUs with torch.distributed/NCCL at the message sizes training sends (powers of two
up to the largest gradient bucket or TP activation, and those sizes themselves), prints time, algorithm bandwidth
and bus bandwidth per size (nccl-tests' definitions: algbw = bytes / time, busbw = algbw x 2 (n - 1) / n), and
exits 1 when the bus bandwidth at the largest size is below preflight.min_busbw_gbps (per GPU type by default),
which stops the afterok chain before training. On failure with several nodes it measures every node alone and
pairs of neighbouring nodes, and names the nodes (or node pairs) well below their peers.

Writes RUN_DIR/preflight.json. `--device cpu` runs the same over gloo on CPUs (for testing the stage without
GPUs)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from datetime import timedelta
import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

import torch

from common.config import Config, reduces_grads_in_fp32
from common.files import atomic_write
from common.plan import Plan
from common.run import load_run_or_exit
from recipes.runtime.ranks import die_with_torchrun, rank_info

MIB = 2**20


@dataclass
class Measurement:
    size_bytes: int
    seconds: float  # per all-reduce, the slowest rank's
    gpus: int
    label: str = ""  # which training message this size is, if any

    @property
    def algbw_gbps(self) -> float:
        return self.size_bytes / self.seconds / 1e9

    @property
    def busbw_gbps(self) -> float:
        """What each GPU's links carried: a ring all-reduce moves 2 (n - 1) / n of the message per GPU."""
        return self.algbw_gbps * 2 * (self.gpus - 1) / self.gpus

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps}


# --------------------------------------------------------------------------- what to measure (no torch)
def training_messages(cfg: Config, plan: Plan) -> dict[str, int]:
    """Bytes of the collectives a training step repeats most: the gradient bucket reduced over DP x CP
    (megatron's DDP buckets: max(40M, 1M x DP) elements with overlapped reduction, else the whole gradient of a
    model-parallel rank) and, with TP, one layer's activation (seq / CP x MBS x hidden, bf16)."""
    par = cfg.parallelism
    messages: dict[str, int] = {}
    if plan.dp * plan.cp > 1:
        local_params = plan.num_parameters // (plan.tp * plan.pp)
        elements = min(max(40_000_000, 1_000_000 * plan.dp), local_params) if par.overlap_grad_reduce else local_params
        messages["gradient bucket"] = elements * (4 if reduces_grads_in_fp32(cfg) else 2)
    if plan.tp > 1:
        hidden = cfg.training.model.hidden_size
        messages["TP activation"] = plan.seq_length // plan.cp * plan.micro_batch_size * hidden * 2
    return messages


def message_sizes(cfg: Config, plan: Plan) -> list[tuple[int, str]]:
    """(bytes, label) ascending: preflight.sizes_mib, or powers of two from 1 MiB up to preflight.max_size_mib
    plus the training messages (capped there too); multiples of 4 bytes. The verdict reads the largest size:
    small messages are latency-bound, so a healthy link shows its bandwidth only on large ones, whatever the size
    of a small model's gradient buckets."""
    pre = cfg.preflight
    cap = int(pre.max_size_mib * MIB)
    if pre.sizes_mib:
        chosen = {int(float(s) * MIB) // 4 * 4: "" for s in pre.sizes_mib}
    else:
        messages = {min(b, cap) // 4 * 4: label for label, b in training_messages(cfg, plan).items()}
        chosen = {MIB * 2**k: "" for k in range(64) if MIB * 2**k <= cap}
        chosen.update(messages)
    return sorted((size, label) for size, label in chosen.items() if size > 0)


def threshold(cfg: Config, plan: Plan) -> tuple[float | None, str]:
    """(GB/s, where it comes from); None when neither preflight.min_busbw_gbps nor the GPU type's default is set."""
    pre = cfg.preflight
    if pre.min_busbw_gbps is not None:
        return float(pre.min_busbw_gbps), "preflight.min_busbw_gbps"
    gpu_type = plan.gpu_type
    by_type = pre.min_busbw_gbps_by_gpu_type
    if gpu_type and by_type.get(gpu_type) is not None:
        return float(by_type[gpu_type]), f"the {gpu_type} default in preflight.min_busbw_gbps_by_gpu_type"
    return None, f"no threshold for GPU type {gpu_type or 'unknown'}: set preflight.min_busbw_gbps"


def node_blocks(world_size: int, gpus_per_node: int) -> list[list[int]]:
    """Ranks of each node: torchrun and srun (block distribution) number a node's ranks consecutively."""
    per_node = gpus_per_node if gpus_per_node and world_size % gpus_per_node == 0 else world_size
    return [list(range(start, start + per_node)) for start in range(0, world_size, per_node)]


def pair_rounds(num_nodes: int) -> list[list[tuple[int, int]]]:
    """Each node paired with its two ring neighbours, scheduled into rounds where no node appears twice, so the
    pairs of a round run at the same time: 2 rounds for an even number of nodes, 3 for an odd one."""
    if num_nodes < 2:
        return []
    pairs = [(0, 1)] if num_nodes == 2 else [(i, (i + 1) % num_nodes) for i in range(num_nodes)]
    rounds: list[list[tuple[int, int]]] = []
    for pair in pairs:
        for round_ in rounds:
            if not any(set(pair) & set(other) for other in round_):
                round_.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


Key = TypeVar("Key", bound=Hashable)


def below_peers(values: Mapping[Key, float], fraction: float) -> list[Key]:
    """Keys whose value is below `fraction` of the median (needs 3 or more to tell an outlier from its peer)."""
    if len(values) < 3:
        return []
    median = statistics.median(values.values())
    return [key for key, value in values.items() if value < fraction * median]


def locate_slow(
    per_node: Mapping[int, float], per_pair: Mapping[tuple[int, int], float], fraction: float
) -> tuple[list[int], list[tuple[int, int]]]:
    """(slow nodes, slow pairs not explained by them). A node is slow when it alone (its NVLink domain) is below
    its peers, or when every pair it is part of is below the other pairs; a slow pair whose nodes are otherwise
    fine is a slow link between them."""
    slow_pairs = set(below_peers(per_pair, fraction))
    slow = set(below_peers(per_node, fraction))
    nodes = sorted({n for pair in per_pair for n in pair})
    for node in nodes:
        mine = [p for p in per_pair if node in p]
        if len(mine) >= 2 and all(p in slow_pairs for p in mine):
            slow.add(node)
    links = sorted(p for p in slow_pairs if not set(p) & slow)
    return sorted(slow), links


def size_text(size_bytes: int) -> str:
    """'64 KiB', '8 MiB', '76.3 MiB'."""
    if size_bytes < MIB:
        return f"{size_bytes / 1024:g} KiB"
    return f"{size_bytes // MIB} MiB" if size_bytes % MIB == 0 else f"{size_bytes / MIB:.1f} MiB"


def format_row(m: Measurement) -> str:
    return f"{size_text(m.size_bytes):>10}  {m.seconds * 1e6:>11.1f}  {m.algbw_gbps:>10.2f}  {m.busbw_gbps:>10.2f}" + (
        f"  ({m.label})" if m.label else ""
    )


TABLE_HEADER = f"{'size':>10}  {'time us':>11}  {'algbw GB/s':>10}  {'busbw GB/s':>10}"


def verdict(
    largest: Measurement,
    limit: float | None,
    source: str,
    slow_nodes: Sequence[str] = (),
    slow_pairs: Sequence[str] = (),
) -> tuple[bool, str]:
    """(passed, the one line that says so)."""
    measured = (
        f"all-reduce bus bandwidth {largest.busbw_gbps:.1f} GB/s at {size_text(largest.size_bytes)} over "
        f"{largest.gpus} GPUs"
    )
    if limit is None:
        return True, f"preflight: passed: {measured} ({source})"
    if largest.busbw_gbps >= limit:
        return True, f"preflight: passed: {measured} >= {limit:g} GB/s ({source})"
    where = ""
    if slow_nodes:
        where += f"; slow nodes: {', '.join(slow_nodes)}"
    if slow_pairs:
        where += f"; slow links between nodes: {', '.join(slow_pairs)}"
    return False, (
        f"preflight: FAILED: {measured} is below {limit:g} GB/s ({source}){where}; training was not "
        "started (fix or exclude the nodes, or lower preflight.min_busbw_gbps to accept)"
    )


# --------------------------------------------------------------------------- collectives
class Collectives:
    """torch.distributed on NCCL (GPUs) or gloo (CPUs, tests)."""

    def __init__(self, device: str, local_rank: int, dtype_name: str):
        self.torch = torch
        self.dist = torch.distributed
        self.device = torch.device("cuda", local_rank) if device == "cuda" else torch.device("cpu")
        self.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name if device == "cuda" else "fp32"]

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def time_all_reduce(
        self, size_bytes: int, group, group_size: int, warmup: int, iterations: int, label: str = ""
    ) -> Measurement:
        torch, dist = self.torch, self.dist
        element = torch.tensor([], dtype=self.dtype).element_size()
        buffer = torch.zeros(size_bytes // element, dtype=self.dtype, device=self.device)  # zeros never overflow
        for _ in range(warmup):
            dist.all_reduce(buffer, group=group)
        self.synchronize()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(buffer, group=group)
        self.synchronize()
        elapsed = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64, device=self.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)  # the slowest rank's time is the job's
        del buffer
        return Measurement(buffer_bytes(size_bytes, element), elapsed.item(), group_size, label)


def buffer_bytes(size_bytes: int, element: int) -> int:
    return size_bytes // element * element


def diagnose(
    coll: Collectives, rank: int, blocks: list[list[int]], size_bytes: int, warmup: int, iterations: int
) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
    """Bus bandwidth of every node alone (all nodes at once) and of neighbouring node pairs (round by round), at
    one message size. Every rank takes part; every rank gets the results."""
    dist = coll.dist
    # Every rank creates every group, in the same order (torch.distributed requires it).
    node_groups = [dist.new_group(ranks) for ranks in blocks] if len(blocks[0]) > 1 else []
    rounds = pair_rounds(len(blocks))
    pair_groups = {pair: dist.new_group(blocks[pair[0]] + blocks[pair[1]]) for round_ in rounds for pair in round_}
    mine: dict[str, Any] = {"node": {}, "pair": {}}
    node = next(i for i, ranks in enumerate(blocks) if rank in ranks)
    if node_groups:
        m = coll.time_all_reduce(size_bytes, node_groups[node], len(blocks[node]), warmup, iterations)
        if rank == blocks[node][0]:
            mine["node"][node] = m.busbw_gbps
    for round_ in rounds:
        for pair in round_:
            if node in pair:
                ranks = blocks[pair[0]] + blocks[pair[1]]
                m = coll.time_all_reduce(size_bytes, pair_groups[pair], len(ranks), warmup, iterations)
                if rank == ranks[0]:
                    mine["pair"][pair] = m.busbw_gbps
        dist.barrier()  # rounds never overlap
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    per_node = {k: v for g in gathered for k, v in g["node"].items()}
    per_pair = {k: v for g in gathered for k, v in g["pair"].items()}
    return per_node, per_pair


# --------------------------------------------------------------------------- the stage
def run(
    run_dir: str,
    cfg: Config,
    plan: Plan,
    rank: int,
    local_rank: int,
    world_size: int,
    device: str,
    say: Callable[[str], None],
) -> int:
    """Every rank runs this; rank 0 prints and writes preflight.json. Returns the exit status."""
    pre = cfg.preflight
    limit, source = threshold(cfg, plan)
    report: dict[str, Any] = {
        "gpus": world_size,
        "nodes": plan.num_nodes,
        "threshold_gbps": limit,
        "threshold_source": source,
    }
    if world_size == 1:
        line = "preflight: passed: one GPU, no communication to measure"
        say(line)
        if rank == 0:
            atomic_write(
                os.path.join(run_dir, "preflight.json"),
                json.dumps({**report, "passed": True, "verdict": line}, indent=2) + "\n",
            )
        return 0
    coll = Collectives(device, local_rank, "fp32" if reduces_grads_in_fp32(cfg) else "bf16")
    dist = coll.dist
    names: list[Any] = [None] * world_size
    dist.all_gather_object(names, socket.gethostname().split(".")[0])
    blocks = node_blocks(world_size, plan.gpus_per_node)
    node_names = [names[b[0]] for b in blocks]
    if len(set(node_names)) < len(node_names):  # e.g. containers that all report one hostname
        node_names = [f"node{i}({n})" for i, n in enumerate(node_names)]
    backend = "gloo"
    if device == "cuda":
        version = torch.cuda.nccl.version()
        backend = "NCCL " + (".".join(map(str, version)) if isinstance(version, tuple) else str(version))
    say(
        f"preflight: all-reduce over {world_size} GPUs ({len(blocks)} node{'s' if len(blocks) > 1 else ''} x "
        f"{len(blocks[0])}), {backend}, {pre.warmup_iterations} warm-up + {pre.iterations} timed "
        f"iterations per size; threshold: "
        + (f"{limit:g} GB/s bus bandwidth at the largest size ({source})" if limit is not None else source)
    )
    say(TABLE_HEADER)
    results = []
    for size, label in message_sizes(cfg, plan):
        m = coll.time_all_reduce(size, None, world_size, pre.warmup_iterations, pre.iterations, label)
        results.append(m)
        say(format_row(m))
    largest = results[-1]
    passed, line = verdict(largest, limit, source)
    slow_nodes: list[str] = []
    slow_pairs: list[str] = []
    if not passed and len(blocks) > 1:
        say(
            f"preflight: below the threshold; measuring each node alone and pairs of nodes at "
            f"{size_text(largest.size_bytes)}"
        )
        per_node, per_pair = diagnose(coll, rank, blocks, largest.size_bytes, pre.warmup_iterations, pre.iterations)
        for node, bw in sorted(per_node.items()):
            say(f"  node {node_names[node]}: {bw:.1f} GB/s")
        for (a, b), bw in sorted(per_pair.items()):
            say(f"  nodes {node_names[a]} + {node_names[b]}: {bw:.1f} GB/s")
        nodes, links = locate_slow(per_node, per_pair, pre.slow_node_fraction)
        slow_nodes = [node_names[n] for n in nodes]
        slow_pairs = [f"{node_names[a]}-{node_names[b]}" for a, b in links]
        passed, line = verdict(largest, limit, source, slow_nodes, slow_pairs)
        report.update(
            per_node={node_names[k]: v for k, v in per_node.items()},
            per_pair={f"{node_names[a]}-{node_names[b]}": v for (a, b), v in per_pair.items()},
        )
    say(line)
    if rank == 0:
        report.update(
            passed=passed,
            verdict=line,
            node_names=node_names,
            slow_nodes=slow_nodes,
            slow_pairs=slow_pairs,
            results=[m.as_dict() for m in results],
        )
        atomic_write(os.path.join(run_dir, "preflight.json"), json.dumps(report, indent=2) + "\n")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="run directory holding config.yaml and plan.json")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda: NCCL over the GPUs (the stage); cpu: gloo over CPUs (testing without GPUs)",
    )
    args = parser.parse_args(argv)
    die_with_torchrun()
    run_dir = os.path.abspath(args.run_dir)
    loaded = load_run_or_exit(run_dir)
    cfg, plan = loaded.config, loaded.plan
    info = rank_info()
    if info.world_size != plan.num_gpus:
        raise SystemExit(
            f"plan.json expects {plan.num_gpus} ranks but this job started {info.world_size}; "
            "launch the preflight with the job in the run directory"
        )

    def say(message: str) -> None:
        if info.rank == 0:
            print(message, flush=True)

    if info.world_size == 1:
        return run(run_dir, cfg, plan, info.rank, info.local_rank, 1, args.device, say)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("preflight: no CUDA GPU is visible to this process; the preflight needs one GPU per rank")
        torch.cuda.set_device(info.local_rank)
    torch.distributed.init_process_group(
        backend="nccl" if args.device == "cuda" else "gloo",
        init_method=f"tcp://{info.master_addr}:{info.master_port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=timedelta(minutes=10),
        device_id=torch.device("cuda", info.local_rank) if args.device == "cuda" else None,
    )
    try:
        return run(run_dir, cfg, plan, info.rank, info.local_rank, info.world_size, args.device, say)
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
