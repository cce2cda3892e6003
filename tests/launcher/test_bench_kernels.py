"""bench/bench_kernels.py's CPU parts: the GEMM shapes of a layer, one step's FLOPs per class against the plan's MFU
formula (computed independently here), the join of a torch-profiler trace with the ceilings, and the refusal of a
measurement of other shapes. The GPU measurement itself runs only on a GPU (docs/performance.md)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
import sys

import pytest

from launcher.autoconf.perfdata import training_model
from launcher.autoconf.steptime import default_constants
from launcher.config.compose import compose
from launcher.jobs.rundir import write_run_dir
from launcher.plan.formulas import lora_layer_parameters, model_flops_per_sample, padded_vocab_size
from launcher.plan.hardware import gpu_spec
from launcher.cli import prepare

from launcher_helpers import REPO, bench_script


kernels = bench_script("bench_kernels")
breakdown = bench_script("profile_breakdown")
MODEL_8B = training_model("llama31_8b")


def _shape(model, tp=1, cp=1, mbs=1, seq=8192, microbatches=4, layers=None, last_stage=True, fp8=False):
    return kernels.StepShape(
        tp,
        cp,
        mbs,
        seq,
        microbatches,
        model.num_layers if layers is None else layers,
        last_stage,
        fp8,
        tp > 1,
        padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, tp),
    )


def test_a_layers_gemms_have_the_models_shapes_forward_and_both_backward():
    gemms = {g.name: (g.m, g.n, g.k) for g in kernels.layer_gemms(MODEL_8B, 1, 8192, fp8=True)}
    assert gemms["qkv fwd"] == (8192, 4096 + 2 * 8 * 128, 4096)
    assert gemms["qkv dgrad"] == (8192, 4096, 6144)
    assert gemms["qkv wgrad"] == (6144, 4096, 8192)
    assert gemms["fc1 fwd"] == (8192, 2 * 14336, 4096)  # gate and up
    assert gemms["fc2 dgrad"] == (8192, 14336, 4096)
    assert gemms["proj wgrad"] == (4096, 4096, 8192)
    assert len(gemms) == 12
    # TP2: qkv and fc1 split their outputs, proj and fc2 their inputs; the output layer stays bf16.
    tp2 = {g.name: (g.m, g.n, g.k) for g in kernels.layer_gemms(MODEL_8B, 2, 8192, fp8=True)}
    assert tp2["qkv fwd"] == (8192, 3072, 4096) and tp2["proj fwd"] == (8192, 4096, 2048)
    assert tp2["fc2 fwd"] == (8192, 4096, 7168)
    output = kernels.output_gemms(MODEL_8B, 2, 8192, 128256)
    assert [(g.name, g.m, g.n, g.k, g.fp8) for g in output][0] == ("output fwd", 8192, 64128, 4096, False)


@pytest.mark.parametrize("model", ["llama31_8b", "llama31_70b"])
@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (1, 2), (4, 2)])
def test_a_steps_gemm_and_attention_flops_are_the_mfu_formulas(model, tp, cp):
    """Independently: the formula's FLOPs of 4 sequences; every GPU of a TP x CP group does 1/(tp cp) of them. The
    formula counts the full square of attention scores, the kernels its causal half."""
    arch = training_model(model)
    shape = _shape(arch, tp=tp, cp=cp, microbatches=4)
    work = kernels.step_work(arch, shape, default_constants())
    per_gpu = work["GEMM"].flops + 2 * (work["attention fwd"].flops + work["attention bwd"].flops)
    # The kernels multiply the padded vocabulary (TP4 pads 128,256 to 128,512); the formula takes the model's.
    padded = dataclasses.replace(arch, vocab_size=shape.padded_vocab)
    assert per_gpu * tp * cp == pytest.approx(4 * model_flops_per_sample(padded, 8192), rel=1e-12)
    # The GEMMs alone by hand: 6 FLOPs per weight per token, the decoder layers' weights and the output layer's.
    h, ffn, heads, groups, d = (
        arch.hidden_size,
        arch.ffn_hidden_size,
        arch.num_attention_heads,
        arch.num_query_groups,
        arch.kv_channels,
    )
    weights = arch.num_layers * (h * (heads + 2 * groups) * d + heads * d * h + 3 * h * ffn) + padded.vocab_size * h
    assert work["GEMM"].flops * tp * cp == pytest.approx(6 * 4 * 8192 * weights, rel=1e-12)


@pytest.mark.parametrize("tp,cp", [(1, 1), (1, 2), (4, 2)])
def test_a_lora_steps_flops_are_the_plans_lora_formula_without_the_adapters(tp, cp):
    """A frozen base has no weight-gradient GEMMs: the step's GEMMs and attention are the plan's LoRA FLOPs less
    the adapters' own (6 per adapter parameter per token), which the join leaves out."""
    lora = compose(["training=llama2/70b", "peft=lora", "peft.target_modules=[linear_qkv,linear_proj]"]).peft
    arch = dataclasses.replace(training_model("llama2_70b"), num_layers=20)
    shape = dataclasses.replace(_shape(arch, tp=tp, cp=cp, microbatches=8), frozen_base=True)
    work = kernels.step_work(arch, shape, default_constants())
    assert not [name for name in work["GEMM"].calls if name.endswith("wgrad")]
    per_gpu = work["GEMM"].flops + 2 * (work["attention fwd"].flops + work["attention bwd"].flops)
    padded = dataclasses.replace(arch, vocab_size=shape.padded_vocab)
    adapters = 6 * arch.num_layers * lora_layer_parameters(padded, lora) * 8192
    assert per_gpu * tp * cp == pytest.approx(8 * (model_flops_per_sample(padded, 8192, lora) - adapters), rel=1e-12)
    assert not [g for g in kernels.wanted_kernels(arch, shape)[0] if g.pass_ == "wgrad"]


def test_stages_without_the_output_layer_have_no_loss_and_fp8_has_casts():
    shape = _shape(MODEL_8B, layers=8, last_stage=False, fp8=True)
    work = kernels.step_work(MODEL_8B, shape, default_constants())
    assert "loss" not in work and "output fwd" not in work["GEMM"].calls
    assert work["FP8 cast/transpose/amax"].bytes > 0 and work["GEMM"].calls["fc1 wgrad"] == 8 * 4
    assert "FP8 cast/transpose/amax" not in kernels.step_work(MODEL_8B, _shape(MODEL_8B), default_constants())


def test_the_join_classes_are_profile_breakdowns_groups():
    split = {"attention fwd", "attention bwd"}
    assert set(kernels.CLASS_ORDER) - split == set(breakdown.ORDER)


def _trace(path, kernel_ms):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1e6}]
    ts = 0.0
    for name, ms in kernel_ms:
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": ms * 1e3})
        ts += ms * 1e3
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


TWO_STEPS = [  # ms over two steps
    ("nvjet_tst_128x256_64x4_2x1_v_bz_TNT", 2000.0),
    ("flash_fwd_kernel", 200.0),
    ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 500.0),
    ("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel", 100.0),
    ("triton_red_fused_copy__exp_sub_sum_unsqueeze_2", 40.0),
    ("void multi_tensor_apply_kernel<AdamFunctor<float>>", 60.0),
]


def _synthetic_ceilings(gemms, attention, gemm_ms=1.0, fwd_ms=2.0, bwd_ms=5.0, copy_gb_s=3000.0):
    measured = [kernels.Measured("GEMM", g.name, gemm_ms, flops=g.flops, shape=g.shape) for g in gemms]
    measured.append(kernels.Measured("attention fwd", "attention fwd", fwd_ms, attention.fwd_flops, 0, attention.shape))
    measured.append(kernels.Measured("attention bwd", "attention bwd", bwd_ms, attention.bwd_flops, 0, attention.shape))
    measured.append(kernels.Measured("copy", "copy", 1000.0, bytes=copy_gb_s * 1e9))
    return kernels.Ceilings("test GPU", measured)


def test_the_join_puts_each_class_of_one_step_beside_its_time_at_the_ceiling(tmp_path):
    shape = _shape(MODEL_8B, layers=2, microbatches=3)
    gemms, attention = kernels.wanted_kernels(MODEL_8B, shape)
    ceilings = _synthetic_ceilings(gemms, attention)
    b = breakdown.breakdown(breakdown.load_events(_trace(tmp_path / "t.json.gz", TWO_STEPS)))
    trace_ms = kernels.trace_class_ms(b, steps=2)
    assert trace_ms["attention fwd"] == 100.0 and trace_ms["attention bwd"] == 250.0 and "attention" not in trace_ms
    work = kernels.step_work(MODEL_8B, shape, default_constants())
    rows = {r.cls: r for r in kernels.join(work, trace_ms, ceilings)}
    # 12 layer GEMMs x 2 layers x 3 microbatches + 3 output GEMMs x 3 microbatches, 1 ms each.
    assert rows["GEMM"].ceiling_ms == pytest.approx(12 * 2 * 3 + 3 * 3)
    assert rows["GEMM"].trace_ms == 1000.0 and rows["GEMM"].gap_ms == pytest.approx(1000 - 81)
    assert rows["attention fwd"].ceiling_ms == pytest.approx(2 * 3 * 2.0)
    assert rows["attention bwd"].gap_ms == pytest.approx(250 - 2 * 3 * 5.0)
    norm = rows["norm/RoPE/SwiGLU"]
    assert norm.ceiling_ms == pytest.approx(work["norm/RoPE/SwiGLU"].bytes / 3000e9 * 1e3)
    assert rows["loss"].trace_ms == 20.0 and rows["loss"].bytes > 0
    assert rows["other"].ceiling_ms is None and rows["other"].trace_ms == 30.0
    assert rows["GEMM"].rate(rows["GEMM"].trace_ms) == pytest.approx(work["GEMM"].flops / 1e12 / 1.0)
    table = kernels.format_join(list(rows.values()), b, steps=2)
    gemm_line = next(line for line in table.splitlines() if line.startswith("GEMM"))
    assert gemm_line.split()[-1] == "+919.0"
    assert "FP8 cast" not in table  # a bf16 step has no casts to show


def test_attention_names_that_do_not_tell_forward_from_backward_make_one_row(tmp_path):
    shape = _shape(MODEL_8B, layers=1, microbatches=1)
    gemms, attention = kernels.wanted_kernels(MODEL_8B, shape)
    trace = _trace(
        tmp_path / "t.json.gz",
        [("nvjet_gemm", 50.0), ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", 30.0)],
    )
    b = breakdown.breakdown(breakdown.load_events(trace))
    rows = {
        r.cls: r
        for r in kernels.join(
            kernels.step_work(MODEL_8B, shape, default_constants()),
            kernels.trace_class_ms(b, 1),
            _synthetic_ceilings(gemms, attention),
        )
    }
    assert "attention fwd" not in rows
    assert rows["attention"].ceiling_ms == pytest.approx(2.0 + 5.0)
    assert rows["attention"].flops == pytest.approx(attention.fwd_flops + attention.bwd_flops)


def test_a_measurement_of_other_shapes_is_refused_in_one_line(tmp_path):
    gemms, attention = kernels.wanted_kernels(MODEL_8B, _shape(MODEL_8B, fp8=True))
    bf16 = kernels.wanted_kernels(MODEL_8B, _shape(MODEL_8B))
    path = tmp_path / "kernels.json"
    ceilings = _synthetic_ceilings(*bf16)
    path.write_text(json.dumps({"gpu": "x", "kernels": [dataclasses.asdict(m) for m in ceilings.kernels]}))
    with pytest.raises(SystemExit, match=r"holds 8192x6144x4096 bf16 for qkv fwd, this run needs 8192x6144x4096 fp8"):
        kernels.check_shapes(kernels.read_ceilings(path), gemms, attention, str(path))
    kernels.check_shapes(kernels.read_ceilings(path), *bf16, str(path))  # the same shapes pass
    fp8_attention = dataclasses.replace(attention, fp8=True)
    bf16_attention = _synthetic_ceilings(gemms, attention)
    path.write_text(json.dumps({"gpu": "x", "kernels": [dataclasses.asdict(m) for m in bf16_attention.kernels]}))
    with pytest.raises(SystemExit, match=r"holds b1 s8192 heads 32/8 d128 causal bf16 for attention fwd, this run"):
        kernels.check_shapes(kernels.read_ceilings(path), gemms, fp8_attention, str(path))
    path.write_text("{}")
    with pytest.raises(SystemExit, match="not a bench_kernels.py --json file"):
        kernels.read_ceilings(path)


def _dry_run(tmp_path, *overrides: str):
    """These overrides prepared as a dry run on cluster=bcm with H200s."""
    where = [f"results_dir={tmp_path}", "run_name=r", "dry_run=true"]
    return prepare(compose([*overrides, "cluster=bcm", "cluster.gpu_type=h200", *where]))


def _join_of_a_dry_run(tmp_path, *overrides: str):
    """A run directory of these overrides (a dry run, cluster=bcm on H200) with a two-step trace of TWO_STEPS,
    joined with the datasheet peaks: the prepared run and the join's rows by class."""
    prepared = _dry_run(tmp_path, *overrides)
    write_run_dir(prepared.run_dir, prepared.cfg, prepared.plan, prepared.stages.jobs, prepared.platform)
    trace = _trace(prepared.run_dir / "profile" / "rank0_steps6-7.pt.trace.json.gz", TWO_STEPS)
    out_json = tmp_path / "join.json"
    assert kernels.main(["--trace", str(trace), "--ceilings", "peak", "--json", str(out_json)]) == 0
    return prepared, {r["cls"]: r for r in json.loads(out_json.read_text())}


def test_a_trace_of_a_run_directory_joins_with_the_datasheet_peaks(tmp_path, capsys):
    prepared, rows = _join_of_a_dry_run(
        tmp_path,
        "training=llama31/8b",
        "training.model.num_layers=2",
        "parallelism=tp1",
        "parallelism.num_gpus=1",
        "dtype=fp8",
        "cluster.gpus_per_node=1",
        "training.global_batch_size=4",
    )
    out = capsys.readouterr().out
    assert "(2 steps, rank 0): 2 layers, 2 on this rank, TP1 CP1, 4 microbatches of 1 x 8192, fp8" in out
    assert "datasheet" in out and "idle (no kernel)" in out and "  exposed" in out
    h200 = gpu_spec("h200")
    work = kernels.step_work(prepared.cfg.training.model, kernels.shape_of_run(prepared.plan, 0), default_constants())
    gemms = kernels.wanted_kernels(prepared.cfg.training.model, kernels.shape_of_run(prepared.plan, 0))[0]
    at_peak = sum(
        work["GEMM"].calls[g.name] * g.flops / (h200.fp8_peak_flops if g.fp8 else h200.bf16_peak_flops) for g in gemms
    )
    assert rows["GEMM"]["ceiling_ms"] == pytest.approx(at_peak * 1e3)
    # The plan trains FP8 attention here (FP8 on an H200, heads of 128), so attention's peak is FP8's.
    assert prepared.plan.fp8_dot_product_attention
    assert rows["attention fwd"]["ceiling_ms"] == pytest.approx(work["attention fwd"].flops / h200.fp8_peak_flops * 1e3)
    assert rows["FP8 cast/transpose/amax"]["trace_ms"] == 0.0 and rows["FP8 cast/transpose/amax"]["bytes"] > 0
    with pytest.raises(SystemExit, match="not a profile.tool=torch trace"):
        kernels.main(["--trace", str(tmp_path / "x.json.gz"), "--ceilings", "peak"])


def test_sustained_joins_a_trace_with_the_back_to_back_ceilings(tmp_path, capsys):
    prepared = _dry_run(
        tmp_path, "training=llama31/8b", "training.model.num_layers=2", "parallelism=tp1", "parallelism.num_gpus=1",
        "dtype=bf16", "cluster.gpus_per_node=1", "training.global_batch_size=4",
    )  # fmt: skip
    write_run_dir(prepared.run_dir, prepared.cfg, prepared.plan, prepared.stages.jobs, prepared.platform)
    trace = _trace(prepared.run_dir / "profile" / "rank0_steps6-7.pt.trace.json.gz", TWO_STEPS)
    gemms, attention = kernels.wanted_kernels(prepared.cfg.training.model, kernels.shape_of_run(prepared.plan, 0))
    ceilings = _synthetic_ceilings(gemms, attention)  # GEMMs 1 ms alone, 1.25 ms back to back
    measured = [dataclasses.replace(m, sustained_ms=1.25) if m.cls == "GEMM" else m for m in ceilings.kernels]
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps({"gpu": "x", "kernels": [dataclasses.asdict(m) for m in measured]}))
    joined = {}
    for flags in ([], ["--sustained"]):
        out_json = tmp_path / "join.json"
        assert kernels.main(["--trace", str(trace), "--ceilings", str(path), "--json", str(out_json), *flags]) == 0
        joined[bool(flags)] = {r["cls"]: r for r in json.loads(out_json.read_text())}
    assert joined[True]["GEMM"]["ceiling_ms"] == pytest.approx(1.25 * joined[False]["GEMM"]["ceiling_ms"])
    assert joined[True]["attention fwd"]["ceiling_ms"] == joined[False]["attention fwd"]["ceiling_ms"]
    assert "ceilings: sustained" in capsys.readouterr().out


def test_a_lora_runs_trace_joins_without_the_bases_weight_gradients(tmp_path, capsys):
    prepared, rows = _join_of_a_dry_run(
        tmp_path,
        "training=llama2/70b",
        "peft=lora",
        "peft.random_base=true",
        "training.model.num_layers=2",
        "parallelism=tp1_cp2",
        "parallelism.num_gpus=2",
        "cluster.gpus_per_node=2",
        "training.global_batch_size=8",
    )
    assert "TP1 CP2, 8 microbatches of 1 x 4096, bf16, LoRA (frozen base)" in capsys.readouterr().out
    # Each GEMM's three passes cost the same: without weight gradients, two thirds of a full step's.
    full = kernels.step_work(prepared.cfg.training.model, kernels.shape_of_run(prepared.plan, 0), default_constants())
    assert rows["GEMM"]["flops"] == pytest.approx(2 / 3 * full["GEMM"].flops, rel=1e-12)


def test_the_module_imports_without_torch():
    code = "import sys; sys.path.insert(0, 'bench'); import bench_kernels; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_attention_backend_is_named_from_its_kernels():
    cudnn = ["cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "nvjet_gemm"]
    assert kernels.attention_backend(cudnn).startswith("FusedAttention (cuDNN): cudnn_generated")
    assert kernels.attention_backend(["flash_fwd_kernel", "flash_bwd_kernel"]).startswith("FlashAttention")
    assert "no attention kernels" in kernels.attention_backend(["nvjet_gemm"])


@pytest.mark.parametrize(
    "dtype, attention, run_overrides",
    [
        ("fp8", None, []),  # the plan's default: FP8 attention where it trains, as on an H200 with heads of 128
        ("fp8", "bf16", ["dtype.fp8_dot_product_attention=false"]),
        ("bf16", None, []),
    ],
)
def test_a_standalone_measurement_has_the_shapes_of_a_run_with_the_same_layout(
    tmp_path, dtype, attention, run_overrides
):
    args = kernels.main.__globals__["argparse"].Namespace(tp=1, mbs=1, seq=8192, dtype=dtype, attention=attention)
    gemms, attention_kernel = kernels.wanted_kernels(MODEL_8B, kernels.standalone_shape(args, MODEL_8B))
    run = _dry_run(
        tmp_path,
        "training=llama31/8b",
        "training.model.num_layers=16",
        "parallelism=tp1",
        "parallelism.num_gpus=1",
        "cluster.gpus_per_node=1",
        "training.global_batch_size=8",
        f"dtype={dtype}",
        *run_overrides,
    )
    run_gemms, run_attention = kernels.wanted_kernels(run.cfg.training.model, kernels.shape_of_run(run.plan, 0))
    assert gemms == run_gemms and attention_kernel == run_attention
    assert attention_kernel.fp8 == (dtype == "fp8" and attention is None)
    assert [g.fp8 for g in gemms].count(False) == (3 if dtype == "fp8" else len(gemms))  # fp8: the output layer's


@pytest.mark.parametrize("fp8", [False, True])
def test_gemm_operands_are_what_transformer_engines_linear_passes_and_give_the_passes_product(fp8):
    torch = pytest.importorskip("torch")
    tokens, outputs, inputs = 3, 5, 7
    for g in kernels.linear_gemms("fc", tokens, outputs, inputs, fp8):
        a, b, layout = kernels._te_operands(g, device="cpu")
        left, right = kernels._factors(a, b, layout)
        got = left.float() @ right.float()
        a, b = a.float(), b.float()
        if fp8:  # Hopper's FP8 GEMMs take TN only: A [n, k], B [m, k], out = B A^T
            assert layout == "TN" and a.shape == (g.n, g.k) and b.shape == (g.m, g.k)
            want = b @ a.t()
        elif g.pass_ == "fwd":  # general_gemm(weight, input, TN): Y = X W^T
            assert layout == "TN" and a.shape == (outputs, inputs) and b.shape == (tokens, inputs)
            want = b @ a.t()
        elif g.pass_ == "dgrad":  # general_gemm(weight, grad_output, NN): dX = dY W
            assert layout == "NN" and a.shape == (outputs, inputs) and b.shape == (tokens, outputs)
            want = b @ a
        else:  # general_gemm(input, grad_output, NT) into main_grad: dW = dY^T X
            assert layout == "NT" and a.shape == (tokens, inputs) and b.shape == (tokens, outputs)
            want = b.t() @ a
        assert got.shape == (g.m, g.n)
        torch.testing.assert_close(got, want)


def _clocked(name, ms, sustained_ms=None, **clocks):
    return kernels.Measured("GEMM", name, ms, flops=2e12, shape="s", sustained_ms=sustained_ms, **clocks)


def test_sustained_ceilings_take_the_back_to_back_times_where_measured(tmp_path):
    ceilings = kernels.Ceilings(
        "GPU",
        [
            _clocked("qkv fwd", 2.0, 2.5),
            kernels.Measured("attention fwd", "attention fwd", 3.0, flops=1e12, shape="a"),
            kernels.Measured("copy", "copy", 1000.0, bytes=4000e9, sustained_ms=1100.0),
        ],
    )
    sustained = ceilings.sustained()
    assert [m.time_ms for m in sustained.kernels] == [2.5, 3.0, 1100.0]
    assert sustained.copy_gb_s == pytest.approx(4000 / 1.1)
    assert [m.time_ms for m in ceilings.kernels] == [2.0, 3.0, 1000.0]  # the burst ceilings are left as they were
    assert "sustained" in sustained.notes[-1]
    with pytest.raises(SystemExit, match="no sustained times"):
        kernels.Ceilings("GPU", [_clocked("qkv fwd", 2.0)]).sustained()


def test_ceilings_of_an_earlier_measurement_read_without_clocks(tmp_path):
    path = tmp_path / "old.json"
    old = {"cls": "GEMM", "name": "qkv fwd", "time_ms": 2.0, "flops": 2e12, "bytes": 0, "shape": "s", "backend": "te"}
    path.write_text(json.dumps({"gpu": "x", "kernels": [old]}))
    (m,) = kernels.read_ceilings(path).kernels
    assert m.sustained_ms is None and m.sm_mhz is None and m.rate == pytest.approx(1000.0)


def test_the_ceilings_table_shows_both_rates_with_their_clocks():
    measured = _clocked("qkv fwd", 2.0, 2.5, sm_mhz=1980.0, power_w=300.0, sustained_sm_mhz=1755.0,
                        sustained_power_w=690.0)  # fmt: skip
    table = kernels.format_ceilings(kernels.Ceilings("GPU", [measured, _clocked("proj fwd", 1.0)]), gpu_spec("h200"),
                                    4800.0)  # fmt: skip
    qkv, proj = (line.split() for line in table.splitlines() if line.startswith("GEMM"))
    # 2 TFLOP in 2 ms alone, 2.5 ms back to back, of the H200's 989 TFLOP/s bf16 peak.
    assert qkv[-8:] == ["1,000", "TFLOP/s", "101.1%", "800", "TFLOP/s", "80.9%", "1,980/1,755", "300/690"]
    assert proj[-4:] == ["-", "-", "-/-", "-/-"]


def test_bad_input_is_one_line_before_any_gpu_work(capsys):
    with pytest.raises(SystemExit, match=r"^--model llama31/9b: .*training/llama31/9b.* \(a training config"):
        kernels.main(["--model", "llama31/9b"])
    with pytest.raises(SystemExit, match="qkv.s outputs / tp is 1228.8: the tensor-parallel size must divide it"):
        kernels.main(["--model", "llama31/8b", "--tp", "5"])
    with pytest.raises(SystemExit):
        kernels.main(["--attention", "fp8"])  # the default --dtype bf16
    assert "--attention fp8 needs --dtype fp8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernels.main(["--sustained"])
    assert "--sustained goes with --trace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernels.main(["--sustained-s", "-1"])
    assert "--sustained-s -1.0: give 0 (off) or a number of seconds" in capsys.readouterr().err
