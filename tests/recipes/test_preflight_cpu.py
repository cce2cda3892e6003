"""The network preflight without GPUs: message sizes from the plan, thresholds, the node pairing and how slow
nodes are told from slow links (with made-up bandwidths), and the stage itself run by torchrun over gloo on CPU
processes posing as 2 and 4 nodes."""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

from common.typed import changed
from launcher.cli import prepare
from launcher.config.compose import compose
from launcher.jobs.rundir import write_run_dir
from launcher.plan.build import build_plan
from launcher.plan.hardware import LocalGpus
from recipes.observability import preflight
from recipes.observability.preflight import MIB, Measurement

REPO = Path(__file__).resolve().parents[2]


def plan_for(*overrides):
    cfg = compose(["cluster=bcm", "dry_run=true", *overrides])
    return cfg, build_plan(cfg)


def test_training_messages_follow_the_plan():
    cfg, plan = plan_for("training=llama31/8b")  # TP1 CP2 DP4
    assert preflight.training_messages(cfg, plan) == {"gradient bucket": 40_000_000 * 2}
    cfg, plan = plan_for("training=llama31/70b")  # TP4 PP4 CP2 VP5 DP2: bucket, and 8192 / 2 x 8192 x 2 bytes
    assert preflight.training_messages(cfg, plan) == {"gradient bucket": 80_000_000, "TP activation": 64 * MIB}
    cfg, plan = plan_for(
        "training=llama31/8b",
        "parallelism.grad_reduce_in_fp32=true",
        "parallelism.overlap_grad_reduce=false",
        "parallelism.num_gpus=16",
    )
    whole = plan.num_parameters // (plan.tp * plan.pp)
    assert preflight.training_messages(cfg, plan) == {"gradient bucket": whole * 4}


def test_sizes_are_powers_of_two_up_to_the_largest_message_plus_the_messages():
    cfg, plan = plan_for("training=llama31/70b")
    sizes = preflight.message_sizes(cfg, plan)
    assert [s for s, _ in sizes] == sorted([MIB * 2**k for k in range(11)] + [80_000_000])  # up to 1 GiB
    assert dict(sizes)[64 * MIB] == "TP activation" and dict(sizes)[80_000_000] == "gradient bucket"
    cfg, plan = plan_for("training=llama31/70b", "preflight.max_size_mib=16")
    assert [s for s, _ in preflight.message_sizes(cfg, plan)] == [MIB * 2**k for k in range(5)]
    cfg, plan = plan_for("preflight.sizes_mib=[0.5,3]")
    assert preflight.message_sizes(cfg, plan) == [(MIB // 2, ""), (3 * MIB, "")]


def test_threshold_is_the_key_or_the_gpu_types_default():
    cfg, plan = plan_for("training=llama31/8b")
    assert preflight.threshold(cfg, plan) == (300.0, "the h100 default in preflight.min_busbw_gbps_by_gpu_type")
    cfg, plan = plan_for("training=llama31/8b", "cluster.gpu_type=b200")
    assert preflight.threshold(cfg, plan)[0] == 600.0
    cfg, plan = plan_for("training=llama31/8b", "preflight.min_busbw_gbps=123.5")
    assert preflight.threshold(cfg, plan) == (123.5, "preflight.min_busbw_gbps")
    plan.gpu_type = None
    cfg = changed(cfg, {"preflight.min_busbw_gbps": None})
    assert preflight.threshold(cfg, plan) == (None, "no threshold for GPU type unknown: set preflight.min_busbw_gbps")


def test_bus_bandwidth_is_nccl_tests_definition():
    m = Measurement(size_bytes=10**9, seconds=0.01, gpus=8)
    assert m.algbw_gbps == pytest.approx(100.0)
    assert m.busbw_gbps == pytest.approx(100.0 * 2 * 7 / 8)
    assert preflight.verdict(m, 100.0, "x")[0] and not preflight.verdict(m, 200.0, "x")[0]


@pytest.mark.parametrize(
    "nodes,rounds",
    [
        (1, []),
        (2, [[(0, 1)]]),
        (4, [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]),
        (5, [[(0, 1), (2, 3)], [(1, 2), (3, 4)], [(4, 0)]]),
    ],
)
def test_pair_rounds_pair_each_node_with_its_neighbours_once_per_round(nodes, rounds):
    assert preflight.pair_rounds(nodes) == rounds
    for round_ in rounds:
        members = [n for pair in round_ for n in pair]
        assert len(members) == len(set(members))


def test_node_blocks_are_consecutive_ranks():
    assert preflight.node_blocks(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert preflight.node_blocks(4, 8) == [[0, 1, 2, 3]]


def test_a_node_slow_with_both_neighbours_is_named_not_its_links():
    per_node = {0: 400.0, 1: 400.0, 2: 400.0, 3: 400.0}
    per_pair = {(0, 1): 300.0, (2, 3): 120.0, (1, 2): 300.0, (3, 0): 110.0}
    assert preflight.locate_slow(per_node, per_pair, 0.8) == ([3], [])


def test_a_slow_pair_between_healthy_nodes_is_a_slow_link():
    per_node = {0: 400.0, 1: 400.0, 2: 400.0, 3: 400.0}
    per_pair = {(0, 1): 300.0, (2, 3): 300.0, (1, 2): 300.0, (3, 0): 100.0}
    assert preflight.locate_slow(per_node, per_pair, 0.8) == ([], [(3, 0)])


def test_a_node_slow_on_its_own_is_named_and_equal_nodes_are_not():
    per_node = {0: 400.0, 1: 390.0, 2: 150.0, 3: 410.0}
    assert preflight.locate_slow(per_node, {}, 0.8) == ([2], [])
    assert preflight.locate_slow({0: 100.0, 1: 100.0, 2: 101.0}, {}, 0.8) == ([], [])
    assert preflight.below_peers({0: 1.0, 1: 100.0}, 0.8) == []  # two cannot tell which one is slow


def test_the_verdict_is_one_line_naming_the_key_and_the_nodes():
    m = Measurement(size_bytes=80 * MIB, seconds=0.01, gpus=16)
    assert [preflight.size_text(s) for s in (MIB // 16, 8 * MIB, 80_000_000)] == ["64 KiB", "8 MiB", "76.3 MiB"]
    passed, line = preflight.verdict(
        m, 300.0, "the h100 default in preflight.min_busbw_gbps_by_gpu_type", ["gpu-07"], ["gpu-01-gpu-02"]
    )
    assert not passed and "\n" not in line
    assert line == (
        "preflight: FAILED: all-reduce bus bandwidth 15.7 GB/s at 80 MiB over 16 GPUs is below 300 "
        "GB/s (the h100 default in preflight.min_busbw_gbps_by_gpu_type); slow nodes: gpu-07; slow "
        "links between nodes: gpu-01-gpu-02; training was not started (fix or exclude the nodes, or "
        "lower preflight.min_busbw_gbps to accept)"
    )
    passed, line = preflight.verdict(m, None, "no threshold for GPU type unknown: set preflight.min_busbw_gbps")
    assert passed and line.startswith("preflight: passed: all-reduce bus bandwidth 15.7 GB/s")


# ----------------------------------------------------------------------------- the stage on CPU processes
def run_dir_for(tmp_path: Path, *overrides: str) -> Path:
    cfg = compose(
        [
            "stages=[preflight,training]",
            "preflight.sizes_mib=[0.0625,0.25]",
            "preflight.iterations=3",
            "preflight.warmup_iterations=1",
            f"results_dir={tmp_path}",
            "parallelism=tp1",
            *overrides,
        ]
    )
    prepared = prepare(cfg, LocalGpus(8, "h100", ("NVIDIA H100 80GB HBM3",) * 8))
    write_run_dir(prepared.run_dir, prepared.cfg, prepared.plan, prepared.stages.jobs, prepared.platform)
    return prepared.run_dir


def torchrun_preflight(run_dir: Path, nproc: int) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            "recipes.preflight",
            "--run-dir",
            str(run_dir),
            "--device",
            "cpu",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_stage_passes_and_prints_the_bandwidth_table(tmp_path):
    run_dir = run_dir_for(tmp_path, "parallelism.num_gpus=2", "preflight.min_busbw_gbps=0.000001")
    result = torchrun_preflight(run_dir, 2)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("preflight: all-reduce over 2 GPUs (1 node x 2), gloo, 1 warm-up + 3 timed")
    assert lines[1].split() == ["size", "time", "us", "algbw", "GB/s", "busbw", "GB/s"]
    assert [line.split()[:2] for line in lines[2:4]] == [["64", "KiB"], ["256", "KiB"]]
    assert lines[-1].startswith("preflight: passed: all-reduce bus bandwidth")
    report = json.loads((run_dir / "preflight.json").read_text())
    assert report["passed"] and [r["size_bytes"] for r in report["results"]] == [MIB // 16, MIB // 4]
    assert all(r["busbw_gbps"] > 0 and r["gpus"] == 2 for r in report["results"])


@pytest.mark.parametrize("nodes,gpus_per_node", [(4, 1), (2, 2)])
def test_below_the_threshold_it_fails_with_one_line_after_measuring_nodes_and_pairs(tmp_path, nodes, gpus_per_node):
    world = nodes * gpus_per_node
    run_dir = run_dir_for(
        tmp_path,
        "cluster=bcm",
        "cluster.container_runtime=none",
        f"cluster.gpus_per_node={gpus_per_node}",
        f"parallelism.num_gpus={world}",
        "preflight.min_busbw_gbps=1000000",
        "dry_run=true",
    )
    result = torchrun_preflight(run_dir, world)
    assert result.returncode != 0
    out = result.stdout.splitlines()
    assert f"preflight: all-reduce over {world} GPUs ({nodes} nodes x {gpus_per_node})" in out[0]
    failed = [line for line in out if line.startswith("preflight: FAILED:")]
    assert len(failed) == 1 and "is below 1e+06 GB/s (preflight.min_busbw_gbps)" in failed[0]
    assert "training was not started" in failed[0]
    report = json.loads((run_dir / "preflight.json").read_text())
    assert not report["passed"] and report["verdict"] == failed[0]
    pairs = {tuple(sorted(p)) for r in preflight.pair_rounds(nodes) for p in r}
    assert len(report["per_pair"]) == len(pairs)
    assert len(report["per_node"]) == (nodes if gpus_per_node > 1 else 0)
    assert all(bw > 0 for bw in [*report["per_pair"].values(), *report["per_node"].values()])
    assert sum(line.startswith("  nodes ") for line in out) == len(pairs)
