"""bench/bench_lora.py on the CPU: every main.py command it runs plans as a dry run with the benchmark's settings,
and the time-to-train arithmetic against the same numbers worked out by hand."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys

import pytest

from launcher_helpers import REPO, bench_script


def test_every_main_py_command_of_the_bench_is_a_valid_dry_run(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_lora.py"), "--print-commands", "--results", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    commands = [shlex.split(line) for line in out.stdout.splitlines()]
    assert len(commands) == 2
    for cmd in commands:
        run = subprocess.run([*cmd, "dry_run=true", "cluster.gpu_type=h100"], cwd=REPO, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        name = next(a.split("=", 1)[1] for a in cmd if a.startswith("run_name="))
        plan = json.loads((tmp_path / name / "plan.json").read_text())
        assert (plan["num_gpus"], plan["cp"], plan["tp"], plan["global_batch_size"], plan["seq_length"]) == (
            2, 2, 1, 8, 8192,
        )  # fmt: skip
        assert plan["est_memory_gib_per_gpu"] < 79.6
        written = (tmp_path / name / "config.yaml").read_text()
        assert "target_modules:\n  - linear_qkv\n  - linear_proj" in written and "rank: 16" in written
        assert bool(plan["fp8"]) == (name == "ours-fp8")
        if plan["fp8"]:
            assert "fp8_amax_history_len: 4" in written and "fp8_dot_product_attention: true" in written


def test_the_rcp_samples_to_target_drop_the_fastest_and_the_slowest():
    bench = bench_script("bench_lora")
    # rcps_llama2_70b_lora.json, llama2_70b_lora_ref_8, written out: 20 runs.
    runs = [3072, 2688, 3456, 3072, 3072, 3072, 3456, 3456, 3072, 2688,
            3456, 3072, 3072, 3072, 3840, 3456, 2688, 3072, 3456, 3456]  # fmt: skip
    kept = sorted(runs)[1:-1]
    assert bench.rcp_samples_to_target(8) == pytest.approx(sum(kept) / 18)
    assert bench.rcp_samples_to_target(8) == pytest.approx(57_216 / 18)  # 3,178.7


def test_time_to_train_arithmetic():
    bench = bench_script("bench_lora")
    # 1,000 tokens/s/GPU x 8 GPUs = 8,000 tokens/s; 3,072 samples x 8,192 tokens / 8,000 = 3,145.728 s of training.
    # The target is seen at evaluation 3,072 / 384 = 8; floor(0.125 x 8 + 2) = 3 are skipped: 5 evaluations of
    # 173 x 8,192 tokens at half a training token's cost: 5 x 173 x 8,192 x 0.5 / 8,000 = 442.88 s.
    t = bench.time_to_train_minutes(1000.0, 3072, eval_cost=0.5)
    assert t["evaluations"] == 5
    assert t["train_min"] == pytest.approx(3145.728 / 60)
    assert t["eval_min"] == pytest.approx(442.88 / 60)
    assert t["total_min"] == pytest.approx((3145.728 + 442.88) / 60)
    # A target between evaluations is seen at the next one; GBS 16 skips floor(2 + 2) = 4.
    t = bench.time_to_train_minutes(1000.0, 3100, gbs=16, eval_cost=1.0)
    assert t["evaluations"] == math.ceil(3100 / 384) - 4 == 5
    # Twice the rate, half the time.
    assert bench.time_to_train_minutes(2000.0, 3072)["total_min"] == pytest.approx(
        bench.time_to_train_minutes(1000.0, 3072)["total_min"] / 2
    )


def test_the_table_and_the_mfu_definition(capsys):
    bench = bench_script("bench_lora")
    r = bench.row("x", "stack", "bf16", 2, 4.0, 1e15)
    assert r["tokens_per_s_per_gpu"] == pytest.approx(8 * 8192 / 4.0 / 2)
    assert r["mfu_bf16_peak"] == pytest.approx(1e15 * 8 / 4.0 / 2 / 989e12)
    bench.print_table([r, {"case": "hf-bf16", "error": "exit 1"}])
    out = capsys.readouterr().out
    assert "8,192" in out and "hf-bf16    exit 1" in out


def test_parts_run_apart_merge_into_one_table(tmp_path, capsys, monkeypatch):
    bench = bench_script("bench_lora")
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps([bench.row("hf-bf16", "HF", "bf16", 1, 8.0, 1e15)]))
    monkeypatch.setattr(bench, "run_ours", lambda name, *a: bench.row(name, "ours", "bf16", 2, 2.0, 1e15))
    monkeypatch.setattr(bench, "lora_flops", lambda layers: (1e15, 1.5e15))
    assert bench.main(["--only", "ours-bf16", "--merge", str(earlier), "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    # 8 x 8192 / 2 s / 2 GPUs against 8 x 8192 / 8 s / 1 GPU
    assert "ours-bf16 / HF PEFT bf16 tokens/s/GPU: 2.00x" in out
    assert "time to train on 8 GPUs, ours-bf16" in out and "NVIDIA on 8 H200: 23.1 min" in out


def test_another_layout_runs_as_a_tagged_case_beside_the_default_one(tmp_path, capsys, monkeypatch):
    bench = bench_script("bench_lora")
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_lora.py"), "--print-commands", "--results", str(tmp_path),
         "--ours-extra", "parallelism=tp1", "--tag", "dp2"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    for line in out.stdout.splitlines():
        run = subprocess.run([*shlex.split(line), "dry_run=true"], cwd=REPO, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    plan = json.loads((tmp_path / "ours-bf16-dp2" / "plan.json").read_text())
    assert (plan["tp"], plan["cp"], plan["dp"]) == (1, 1, 2) and bench.layout_of(plan) == "DP2"
    assert bench.layout_of({"tp": 1, "pp": 1, "vp": None, "cp": 2, "dp": 1}) == "CP2"
    # Every tagged bf16 case is set against HF's row.
    earlier = tmp_path / "earlier.json"
    rows = [bench.row("hf-bf16", "HF", "bf16", 1, 8.0, 1e15), bench.row("ours-bf16", "ours", "bf16", 2, 4.0, 1e15)]
    earlier.write_text(json.dumps(rows))
    monkeypatch.setattr(bench, "run_ours", lambda name, *a: bench.row(name, "ours", "bf16", 2, 2.0, 1e15))
    monkeypatch.setattr(bench, "lora_flops", lambda layers: (1e15, 1.5e15))
    argv = ["--only", "ours-bf16", "--tag", "dp2", "--merge", str(earlier), "--results", str(tmp_path / "r")]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert "ours-bf16-dp2 / HF PEFT bf16 tokens/s/GPU: 2.00x" in printed
    assert "ours-bf16 / HF PEFT bf16 tokens/s/GPU: 1.00x" in printed


def test_profiled_runs_trace_a_step_before_the_timing_window_and_name_the_kernel_join(tmp_path, capsys, monkeypatch):
    bench = bench_script("bench_lora")
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_lora.py"), "--print-commands", "--results", str(tmp_path),
         "--profile"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    for line in out.stdout.splitlines():
        run = subprocess.run([*shlex.split(line), "dry_run=true"], cwd=REPO, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    written = (tmp_path / "ours-fp8-profiled" / "config.yaml").read_text()
    assert "tool: torch" in written and "start_step: 4" in written and "end_step: 5" in written
    monkeypatch.setattr(bench, "run_ours", lambda name, *a: bench.row(name, "ours", "bf16", 2, 2.0, 1e15))
    monkeypatch.setattr(bench, "lora_flops", lambda layers: (1e15, 1.5e15))
    assert bench.main(["--only", "ours-bf16", "--profile", "--results", str(tmp_path / "r")]) == 0
    trace = tmp_path / "r" / "ours-bf16-profiled" / "profile" / "rank0_steps4-4.pt.trace.json.gz"
    assert f"ours-bf16-profiled: python bench/bench_kernels.py --trace {trace}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--profile traces step 4: --window 9 would time it"):
        bench.main(["--profile", "--window", "9", "--results", str(tmp_path / "r")])


def test_time_to_train_is_the_whole_models_not_the_proxys(tmp_path, capsys, monkeypatch):
    """The proxy has 20 of the 80 layers: the time to train divides its rate by the FLOPs per sample it lacks."""
    bench = bench_script("bench_lora")
    monkeypatch.setattr(bench, "run_ours", lambda name, *a: bench.row(name, "ours", "bf16", 2, 2.0, 1e15))
    monkeypatch.setattr(bench, "lora_flops", lambda layers: (layers * 1e13, layers * 1.5e13))
    monkeypatch.setattr(bench, "rcp_samples_to_target", lambda gbs: 3072.0)
    assert bench.main(["--only", "ours-bf16", "--layers", "20", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    proxy_rate = 8 * 8192 / 2.0 / 2
    expected = bench.time_to_train_minutes(proxy_rate * 20 / 80, 3072.0, eval_cost=0.5)["total_min"]
    assert f"ours-bf16: {expected:.1f} min" in out
    assert f"({proxy_rate / 4:,.0f} tokens/s/GPU)" in out


@pytest.mark.parametrize("name", list(bench_script("bench_lora").FP8_VARIANTS))
def test_every_fp8_variant_plans_on_two_h100s_with_the_benchmarks_settings(name, tmp_path):
    bench = bench_script("bench_lora")
    argv = bench.variants_argv(20, 12, 6, [])
    cases = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--case"}
    assert list(cases)[0] == "fp8" and argv[:2] == ["--model", "llama2/70b"] and argv[argv.index("--gbs") + 1] == "8"
    cmd = [sys.executable, str(REPO / "main.py"), "training=llama2/70b", "cluster=bcm", "cluster.gpu_type=h100",
           "cluster.gpus_per_node=2", "parallelism.num_gpus=2", "training.global_batch_size=8",
           "training.data.mock=true", *shlex.split(cases[name]), f"results_dir={tmp_path}", "run_name=r",
           "dry_run=true"]  # fmt: skip
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    written = (tmp_path / "r" / "config.yaml").read_text()
    assert (plan["cp"], plan["tp"], plan["seq_length"]) == (2, 1, 8192) and "rank: 16" in written
    assert plan["est_memory_gib_per_gpu"] < 79.6
    # NVIDIA's settings in every case but those that change them.
    settings = {
        "fp8_amax_history_len: 4": {"fp8-amax-history-1024"},
        "fp8_dot_product_attention: true": {"fp8-attention-off", "fp8-params-attention-off"},
    }
    for setting, changed_by in settings.items():
        assert (setting in written) == (name not in changed_by), setting


def test_variants_pass_bench_trains_arguments_on(tmp_path, monkeypatch):
    bench = bench_script("bench_lora")
    sys.path.insert(0, str(REPO / "bench"))
    import bench_train

    ran = []
    monkeypatch.setattr(bench_train, "run_case", lambda name, *a, **k: ran.append(name) or {"case": name, "error": "x"})
    assert bench.main(["variants", "--only", "fp8-params", "--repeat", "2", "--results", str(tmp_path)]) == 0
    assert ran == ["fp8-r1", "fp8-params-r1", "fp8-r2", "fp8-params-r2"]


def test_without_mlperf_logging_the_rows_stand_and_the_time_to_train_says_what_it_needs(tmp_path, capsys, monkeypatch):
    """A GPU host without mlperf-logging still gets its measured rows (the time to train needs the RCP file)."""
    bench = bench_script("bench_lora")

    def no_package(gbs):
        raise ModuleNotFoundError("No module named 'mlperf_logging'")

    monkeypatch.setattr(bench, "run_ours", lambda name, *a: bench.row(name, "ours", "bf16", 2, 2.0, 1e15))
    monkeypatch.setattr(bench, "rcp_samples_to_target", no_package)
    assert bench.main(["--only", "ours-bf16", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ours-bf16" in out and "time to train: not computed, it needs mlperf-logging's RCP file" in out
    assert [r["case"] for r in json.loads((tmp_path / "bench_lora.json").read_text())] == ["ours-bf16"]
