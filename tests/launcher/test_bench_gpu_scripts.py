"""The GPU measurement scripts, checked without a GPU: every case plans and fits one H200, each part stays within
its time budget by the estimates, a reused output directory is refused, the kernel grouping of a profile, and a
hung case killed with its whole process group."""

from __future__ import annotations

import gzip
import json
import os
import re
import textwrap
import time

import pytest

from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.hardware import gpu_spec

from launcher_helpers import bench_script


measurements = bench_script("gpu_measurements")
breakdown = bench_script("profile_breakdown")
bench_train = bench_script("bench_train")


@pytest.mark.parametrize("case", measurements.CASES, ids=lambda c: c.name)
def test_every_case_plans_and_fits_one_h200(case):
    assert re.fullmatch(r"[A-Za-z0-9._=+-]+", case.name)
    cfg = compose(
        [
            f"training={case.model}",
            *case.overrides,
            "cluster=bcm",
            "cluster.gpu_type=h200",
            "cluster.gpus_per_node=1",
            "parallelism.num_gpus=1",
            "training.global_batch_size=8",
            f"training.train_steps={case.steps}",
            "memory_check=false",
        ]
    )
    plan = build_plan(cfg)
    assert plan.num_gpus == 1 and plan.est_memory_gib_per_gpu <= gpu_spec("h200").memory_gib
    assert case.window < case.steps


def test_each_part_fits_its_budget_and_covers_what_the_defaults_rest_on():
    for part in (1, 2):
        cases = measurements.selected(str(part), None)
        assert sum(c.estimate_s for c in cases) <= 540, part
    names = {c.name for c in measurements.CASES}
    assert {
        "8b16-bf16",
        "8b16-fp8",
        "70b2-bf16",
        "70b2-fp8",
        "tiny-graphs-none",
        "tiny-graphs-per-layer",
        "tiny-graphs-full-iter",
        "8b16-fp8-graphs-per-layer",
        "8b16-fp8-graphs-full-iter",
    } <= names
    assert {c.profile for c in measurements.CASES if c.profile} == {"before", "after"}
    # The profiled step lies before the timing window.
    for case in measurements.CASES:
        if case.profile:
            start = int(next(o for o in case.overrides if o.startswith("profile.start_step=")).split("=")[1])
            assert start <= case.steps - case.window


def test_the_scripts_list_their_cases_and_refuse_a_reused_output_directory(tmp_path, capsys):
    assert measurements.main(["--out", str(tmp_path), "--list", "--part", "all"]) == 0
    listed = capsys.readouterr().out
    assert all(c.name in listed for c in measurements.CASES)
    (tmp_path / "runs" / "8b16-bf16").mkdir(parents=True)
    with pytest.raises(SystemExit, match="already holds 8b16-bf16; give this measurement another OUTDIR"):
        measurements.main(["--out", str(tmp_path), "--only", "8b16-bf16"])
    with pytest.raises(SystemExit, match="unknown case"):
        measurements.main(["--out", str(tmp_path), "--only", "nope"])


KERNELS = {
    "nvjet_qqtst_128x256_64x4_2x1_v_bz_coopA_TNN": "GEMM",
    "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1": "GEMM",
    "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0": "attention",
    "void transformer_engine::detail::cast_transpose_general_kernel<64, 8, float, __nv_bfloat16>": (
        "FP8 cast/transpose/amax"
    ),
    "void transformer_engine::delayed_scaling_recipe::amax_and_scale_update_kernel": "FP8 cast/transpose/amax",
    "void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<float, __nv_fp8_e4m3>": "norm/RoPE/SwiGLU",
    "void transformer_engine::fused_rope::fused_rope_forward_kernel<__nv_bfloat16>": "norm/RoPE/SwiGLU",
    "void transformer_engine::cast_gated_kernel<silu, __nv_fp8_e4m3>": "norm/RoPE/SwiGLU",
    "triton_poi_fused_mul_silu_0": "norm/RoPE/SwiGLU",
    "triton_red_fused_copy__exp_sub_sum_unsqueeze_2": "loss",
    "void transformer_engine::cross_entropy_kernel": "loss",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, LogSoftMaxForwardEpilogue>": (
        "loss"
    ),
    "triton_poi_fused_add_1": "other",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": "other",
    "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>": "other",
}


def test_kernels_are_grouped_by_what_they_do():
    for name, group in KERNELS.items():
        assert breakdown.group_of(name) == group, name


def _trace(path, kernels):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1e6}]
    ts = 0.0
    for name, dur_ms in kernels:
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur_ms * 1e3})
        ts += dur_ms * 1e3 + 10
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_a_profile_breakdown_before_and_after(tmp_path, capsys):
    cast = "cast_transpose_general_kernel"
    before = _trace(tmp_path / "before.pt.trace.json.gz", [("nvjet_gemm", 1000), (cast, 300), ("flash_fwd", 400)])
    after = _trace(tmp_path / "after.pt.trace.json.gz", [("nvjet_gemm", 1000), (cast, 100), ("flash_fwd", 400)])
    b = breakdown.breakdown(breakdown.load_events(before))
    assert b.ms["GEMM"] == 1000 and b.ms["FP8 cast/transpose/amax"] == 300 and b.total_ms == 1700
    assert b.span_ms == pytest.approx(1700.02)
    assert breakdown.main([f"before={before}", f"after={after}"]) == 0
    out = capsys.readouterr().out
    cast_row = next(line for line in out.splitlines() if line.startswith("FP8 cast/transpose/amax"))
    assert "300.0 ms" in cast_row and "100.0 ms" in cast_row and cast_row.rstrip().endswith("-200.0ms")
    assert "the 3 longest kernels of each group" in out


def test_exposed_communication_is_what_no_other_kernel_overlaps_and_idle_what_no_kernel_covers(tmp_path, capsys):
    """A hand-made timeline (ms): GEMMs 0-10 and 12-20 on one stream; on another, a reduce-scatter 8-14 (2 ms of it
    alone, 10-12), a userbuffers exchange 15-17 (all under the second GEMM), a peer-to-peer copy 21-22 (alone); an
    all-gather 25-27 after 3 ms with nothing running (22-25)."""
    spans = [
        ("kernel", "nvjet_tst_gemm", 0, 10),
        ("kernel", "nvjet_tst_gemm", 12, 20),
        ("kernel", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 8, 14),
        ("kernel", "userbuffers_fp16_sum_inplace_gpu_rr_rs", 15, 17),
        ("gpu_memcpy", "Memcpy PtoP (Device -> Device)", 21, 22),
        ("kernel", "ncclDevKernel_AllGather_RING_LL", 25, 27),
    ]
    events = [{"ph": "X", "cat": c, "name": n, "ts": a * 1e3, "dur": (b - a) * 1e3} for c, n, a, b in spans]
    path = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    b = breakdown.breakdown(breakdown.load_events(path))
    assert b.span_ms == pytest.approx(27)
    assert b.communication_ms == pytest.approx(6 + 2 + 1 + 2)
    assert b.exposed_communication_ms == pytest.approx(2 + 1 + 2)  # 10-12, 21-22, 25-27
    assert b.idle_ms == pytest.approx(1 + 3)  # 20-21, 22-25
    assert b.ms["GEMM"] == pytest.approx(18) and b.total_ms == pytest.approx(18 + 10)  # the copy is no kernel
    # Split by kernel: each communication kernel's time outside both GEMMs; the 15-17 exchange has none.
    assert dict(b.exposed_by_kernel) == pytest.approx(
        {
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": 2,
            "userbuffers_fp16_sum_inplace_gpu_rr_rs": 0,
            "Memcpy PtoP (Device -> Device)": 1,
            "ncclDevKernel_AllGather_RING_LL": 2,
        }
    )
    # The gaps, longest first, each named by the kernel after it.
    assert [name for _, name in b.idle_gaps] == ["ncclDevKernel_AllGather_RING_LL", "Memcpy PtoP (Device -> Device)"]
    assert [ms for ms, _ in b.idle_gaps] == pytest.approx([3, 1])
    assert breakdown.main([str(path), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert next(line for line in out.splitlines() if line.startswith("  exposed")).split()[1:3] == ["5.0", "ms"]
    listed = out.split("exposed communication, the 2 kernels with the most")[1].splitlines()[1:3]
    assert [line.split()[0] for line in listed] == ["2.0", "2.0"]
    assert {line.split()[1] for line in listed} == {
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
        "ncclDevKernel_AllGather_RING_LL",
    }
    gaps = out.split("idle, the 2 longest gaps")[1].splitlines()[1:3]
    assert gaps[0].split() == ["3.00", "ncclDevKernel_AllGather_RING_LL"] and gaps[1].split()[0] == "1.00"


def test_a_hung_case_is_killed_with_its_whole_process_group(tmp_path, monkeypatch):
    fake = tmp_path / "repo"
    fake.mkdir()
    pid_file = tmp_path / "child.pid"
    # main.py stand-in: starts a child (as torchrun starts ranks) and hangs.
    (fake / "main.py").write_text(
        textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("started", flush=True)
        time.sleep(600)
    """)
    )
    monkeypatch.setattr(bench_train, "REPO", fake)
    args = type("A", (), {"model": "llama31/tiny", "gpus": 1, "gbs": 8, "steps": 2, "window": 1})()
    row = bench_train.run_case("hung", [], args, tmp_path, timeout=3)
    assert row == {"case": "hung", "error": "killed after 3 s"}
    assert "started" in (tmp_path / "hung.out").read_text()
    child = int(pid_file.read_text())
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the case's child process {child} outlived the kill")


two_gpu = bench_script("two_gpu_fp8")


@pytest.mark.parametrize(
    "name,overrides", [*two_gpu.VARIANTS.items(), *two_gpu.PROFILED.items()], ids=lambda x: str(x)[:40]
)
def test_every_two_gpu_case_plans_and_fits_two_h100s(name, overrides):
    assert re.fullmatch(r"[A-Za-z0-9._=+-]+", name)
    cfg = compose(
        [
            f"training={two_gpu.MODEL}",
            *overrides.split(),
            "cluster=bcm",
            "cluster.gpu_type=h100",
            "cluster.gpus_per_node=2",
            f"parallelism.num_gpus={two_gpu.GPUS}",
            f"training.global_batch_size={two_gpu.GBS}",
            f"training.train_steps={two_gpu.STEPS}",
            "memory_check=false",
        ]
    )
    plan = build_plan(cfg)
    assert plan.dp == 2 and plan.layers_per_pipeline_stage == [16]
    assert plan.est_memory_gib_per_gpu <= gpu_spec("h100").memory_gib
    if name in two_gpu.PROFILED:
        assert cfg.profile.start_step <= two_gpu.STEPS - two_gpu.WINDOW  # profiled before the timing window


def test_the_two_gpu_variants_compare_with_the_defaults_and_keep_the_callers_arguments():
    argv = two_gpu.bench_argv("variants", ["--repeat", "5", "--budget-s", "540"])
    cases = [argv[i + 1] for i, a in enumerate(argv) if a == "--case"]
    assert cases[0] == "fp8" and len(cases) == 9
    assert argv[argv.index("--repeat") + 1] == "3" and argv[-4:] == ["--repeat", "5", "--budget-s", "540"]
    # At DP2 the plan leaves FP8 param gather off (bf16 weights fit): the defaults are its "off" side.
    defaults = compose(
        [
            "training=llama31/8b",
            *two_gpu.VARIANTS["fp8"].split(),
            "cluster=bcm",
            "cluster.gpu_type=h100",
            "cluster.gpus_per_node=2",
            "parallelism.num_gpus=2",
            "training.global_batch_size=16",
        ]
    )
    plan = build_plan(defaults)
    assert not plan.fp8_param_gather and plan.cuda_graphs == "none"
    assert "dtype.fp8_param_gather=true" in two_gpu.VARIANTS["fp8-param-gather-on"]
    # FP8 attention is on in the defaults (delayed scaling, heads of 128): the variant is its "off" side.
    assert plan.fp8_dot_product_attention
    assert "dtype.fp8_dot_product_attention=false" in two_gpu.VARIANTS["fp8-attention-off"]
    # The defaults take Transformer Engine's loss (one tensor-parallel rank) and megatron-core's SwiGLU: the two
    # last variants are the other kernel of each.
    assert plan.cross_entropy_fusion == "te" and not defaults.dtype.te_activation_func
    assert "cross_entropy_fusion=native" in two_gpu.VARIANTS["fp8-native-loss"]
    assert "te_activation_func=true" in two_gpu.VARIANTS["fp8-te-activation"]


def test_only_keeps_the_defaults_beside_the_named_variants_and_refuses_an_unknown_name(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(bench_train, "run_case", lambda name, *a, **k: ran.append(name) or {"case": name, "error": "x"})
    rest = ["--only", "fp8-op-fuser", "--only", "fp8-tensorwise", "--results", str(tmp_path)]
    bench_train.main(two_gpu.bench_argv("variants", rest))
    assert ran == ["fp8-r1", "fp8-op-fuser-r1", "fp8-tensorwise-r1", "fp8-r2", "fp8-op-fuser-r2", "fp8-tensorwise-r2",
                   "fp8-r3", "fp8-op-fuser-r3", "fp8-tensorwise-r3"]  # fmt: skip
    with pytest.raises(SystemExit):
        bench_train.main(two_gpu.bench_argv("variants", ["--only", "fp8-nope", "--results", str(tmp_path / "b")]))
    assert "--only fp8-nope: not a case (one of fp8, fp8-param-gather-on" in capsys.readouterr().err
