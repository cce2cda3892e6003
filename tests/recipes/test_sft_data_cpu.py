"""The trainer's fine-tuning data on the CPU: sequences built from prepared samples against sequences written out
by hand, packing's boundaries (cu_seqlens, position ids, loss mask), padding one sample per sequence, truncation
and refusal of long samples, the seeded order and the held-out split."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from data_prep.indexed import IndexWriter
from data_prep.sft import MASK_DTYPE
from data_prep.shards import LOSS_MASK
from recipes.trainer.sft import (
    SftDataError,
    SftSamples,
    boundaries_of,
    build_sequence,
    collate_packed,
    epochs,
    pack,
    packed_microbatch,
    packed_seq_params,
    sft_datasets,
    split_samples,
)

PAD = 0


def write_prepared(prefix: Path, samples: list[tuple[list[int], list[int]]]) -> str:
    """Samples as data preparation writes them: tokens and loss mask, one indexed sequence per sample."""
    lengths = np.array([len(t) for t, _ in samples], np.int64)
    for path, dtype, pick in ((str(prefix), np.uint16, 0), (str(prefix) + LOSS_MASK, MASK_DTYPE, 1)):
        writer = IndexWriter(path + ".bin", dtype)
        writer.add_documents(np.concatenate([np.asarray(s[pick]) for s in samples]), lengths)
        writer.finalize(path + ".idx")
    return str(prefix)


# Three samples: (tokens, mask where 1 marks a response token).
A = ([11, 12, 13, 14], [0, 0, 1, 1])
B = ([21, 22, 23], [0, 1, 1])
C = ([31, 32, 33, 34, 35], [0, 0, 0, 1, 1])


def test_a_packed_sequence_is_what_hand_building_gives():
    built = build_sequence([(np.array(A[0]), np.array(A[1])), (np.array(B[0]), np.array(B[1]))], 10, PAD)
    # Each sample: inputs its tokens, labels the next token of the same sample (the last predicts nothing),
    # the loss on response labels only; padding after both, loss 0, positions restart per segment.
    assert built["tokens"].tolist() == [11, 12, 13, 14, 21, 22, 23, PAD, PAD, PAD]
    assert built["labels"].tolist() == [12, 13, 14, PAD, 22, 23, PAD, PAD, PAD, PAD]
    assert built["loss_mask"].tolist() == [0, 1, 1, 0, 1, 1, 0, 0, 0, 0]
    assert built["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]
    assert built["cu_seqlens"].tolist() == [0, 4, 7, 10] and built["cu_seqlens"].dtype == np.int32
    assert built["max_seqlen"] == 4


def test_a_full_sequence_has_no_padding_segment():
    built = build_sequence([(np.array(A[0]), np.array(A[1])), (np.array(C[0]), np.array(C[1]))], 9, PAD)
    assert built["cu_seqlens"].tolist() == [0, 4, 9] and built["max_seqlen"] == 5
    with pytest.raises(ValueError, match="do not fit"):
        build_sequence([(np.array(C[0]), np.array(C[1]))] * 2, 9, PAD)


def test_packed_batch_from_prepared_data_matches_the_samples(tmp_path):
    prefix = write_prepared(tmp_path / "s_sft_document", [A, B, C])
    samples = SftSamples([prefix])
    assert samples.lengths.tolist() == [4, 3, 5]
    for i, (tokens, mask) in enumerate([A, B, C]):
        got_tokens, got_mask = samples.sample(i)
        assert got_tokens.tolist() == tokens and got_mask.tolist() == mask
    train, valid = sft_datasets(
        [prefix], None, "1,0,0", 7, 8, packing=True, truncate=False, pad_id=PAD, train_sequences=2, valid_sequences=0
    )
    assert valid is None
    order = split_samples(3, "1,0,0", 7)[0].tolist()
    expected_plan = pack(np.array(order), samples.lengths, 8, True)
    items = [train[0], train[1]]
    # Each packed sequence equals build_sequence over its samples, and every sample of the epoch appears once.
    for item, indices in zip(items, expected_plan):
        by_hand = build_sequence([samples.sample(i) for i in indices.tolist()], 8, PAD)
        for key in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens"):
            assert item[key].tolist() == by_hand[key].tolist(), key
    assert sorted(i for indices in expected_plan[:2] for i in indices.tolist()) == [0, 1, 2]
    batch = collate_packed(items)
    assert batch["tokens"].shape == (2, 8)
    first, second = items[0]["cu_seqlens"].tolist(), items[1]["cu_seqlens"].tolist()
    assert batch["cu_seqlens"].tolist() == first + [8 + b for b in second[1:]]
    assert batch["cu_seqlens"].dtype == torch.int32


def test_without_packing_each_sample_is_alone_and_padded(tmp_path):
    prefix = write_prepared(tmp_path / "s_sft_document", [A, B, C])
    train, _ = sft_datasets(
        [prefix], None, "1,0,0", 3, 6, packing=False, truncate=False, pad_id=PAD, train_sequences=3, valid_sequences=0
    )
    order = split_samples(3, "1,0,0", 3)[0].tolist()
    for k, i in enumerate(order):
        tokens, mask = [A, B, C][i]
        item = train[k]
        n = len(tokens)
        assert item["tokens"].tolist() == tokens + [PAD] * (6 - n)
        assert item["labels"].tolist()[: n - 1] == tokens[1:]
        assert item["loss_mask"].tolist() == [float(m) for m in mask[1:]] + [0.0] * (7 - n)
        assert item["position_ids"].tolist() == list(range(n)) + list(range(6 - n))


def test_long_samples_are_cut_or_refused_naming_the_sample(tmp_path):
    prefix = write_prepared(tmp_path / "s_sft_document", [A, C, B])
    with pytest.raises(SftDataError) as refused:
        sft_datasets([prefix], None, "1,0,0", 1, 4, False, False, PAD, 3, 0)
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert f"sample 1 of {prefix} has 5 tokens, more than training.seq_length=4" in message
    train, _ = sft_datasets([prefix], None, "1,0,0", 1, 4, False, True, PAD, 3, 0)
    cut = [train[k] for k in range(3) if train[k]["tokens"][0] == 31][0]
    assert cut["tokens"].tolist() == C[0][:4] and cut["loss_mask"].tolist() == [0, 0, 1, 0]


def test_order_and_split_are_the_seeds(tmp_path):
    train_a, valid_a = split_samples(100, "80,20,0", seed=5)
    train_b, valid_b = split_samples(100, "80,20,0", seed=5)
    assert train_a.tolist() == train_b.tolist() and valid_a.tolist() == valid_b.tolist()
    assert len(train_a) == 80 and len(valid_a) == 20
    assert sorted(train_a.tolist() + valid_a.tolist()) == list(range(100))  # held out: never trained on
    assert split_samples(100, "80,20,0", seed=6)[0].tolist() != train_a.tolist()
    lengths = np.full(100, 3)
    # Epochs repeat the training part, each in its own seeded order.
    plan = epochs(train_a, 5, 160, lengths, 3, packing=False)
    first, second = [int(p[0]) for p in plan[:80]], [int(p[0]) for p in plan[80:]]
    assert first == train_a.tolist() and sorted(second) == sorted(first) and second != first
    assert [p.tolist() for p in epochs(train_a, 5, 160, lengths, 3, False)] == [p.tolist() for p in plan]


def test_validation_is_the_held_out_part_or_valid_blend(tmp_path):
    samples = [([i, i + 1, i + 2], [0, 1, 1]) for i in range(10, 40, 3)]
    prefix = write_prepared(tmp_path / "s_sft_document", samples)
    train, valid = sft_datasets([prefix], None, "8,2,0", 9, 4, False, False, PAD, 8, 2)
    assert valid is not None and len(valid) == 2
    held_out = {int(valid[k]["tokens"][0]) for k in range(2)}
    trained = {int(train[k]["tokens"][0]) for k in range(8)}
    assert not held_out & trained and len(held_out | trained) == 10
    other = write_prepared(tmp_path / "v_sft_document", [A, B])
    with pytest.raises(SftDataError, match="make 2 validation sequences but an evaluation reads 3"):
        sft_datasets([prefix], None, "8,2,0", 9, 4, False, False, PAD, 8, 3)
    train, valid = sft_datasets([prefix], [other], "8,2,0", 9, 4, False, False, PAD, 10, 2)
    assert valid is not None and [valid[k]["tokens"][0].item() for k in range(2)] == [11, 21]  # in order
    assert len({int(train[k]["tokens"][0]) for k in range(10)}) == 10  # every sample trains


def test_data_without_a_loss_mask_is_one_line(tmp_path):
    prefix = write_prepared(tmp_path / "s_sft_document", [A])
    (tmp_path / f"s_sft_document{LOSS_MASK}.idx").unlink()
    with pytest.raises(SftDataError, match="has no loss mask") as refused:
        SftSamples([prefix])
    assert len(str(refused.value).splitlines()) == 1


def test_packed_seq_params_for_megatron():
    pytest.importorskip("megatron.core.packed_seq_params")
    cu = torch.tensor([0, 4, 7, 10], dtype=torch.int32)
    params = packed_seq_params(cu, 4)
    assert params.qkv_format == "thd" and params.cu_seqlens_q is cu and params.cu_seqlens_kv is cu
    # Samples lie back to back: the padded boundaries are the boundaries, and nothing is padded between them.
    assert params.cu_seqlens_q_padded is cu and params.cu_seqlens_kv_padded is cu and params.pad_between_seqs is False
    assert params.max_seqlen_q == params.max_seqlen_kv == 4


def test_the_trainer_finds_the_boundaries_in_the_position_ids(tmp_path):
    """What the model gets from a microbatch of packed sequences: one THD sequence of mbs * seq tokens, with the
    cu_seqlens collate_packed computes from the items (position ids restart at every sample and at the padding)."""
    pytest.importorskip("megatron.core.packed_seq_params")
    prefix = write_prepared(tmp_path / "s_sft_document", [A, B, C, B, A])
    train, _ = sft_datasets([prefix], None, "1,0,0", 4, 9, True, False, PAD, train_sequences=3, valid_sequences=0)
    items = [train[k] for k in range(3)]
    expected = collate_packed(items)
    stacked = {
        key: torch.stack([item[key] for item in items]) for key in ("tokens", "labels", "loss_mask", "position_ids")
    }
    assert boundaries_of(stacked["position_ids"]).tolist() == expected["cu_seqlens"].tolist()
    assert len(expected["cu_seqlens"]) > 4  # several samples, and padding, in the microbatch
    packed = packed_microbatch(stacked)
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        assert packed[key].shape == (1, 27) and packed[key][0].tolist() == stacked[key].reshape(-1).tolist(), key
    params = packed["packed_seq_params"]
    assert params.cu_seqlens_q.tolist() == expected["cu_seqlens"].tolist() and params.cu_seqlens_q.dtype == torch.int32
    assert params.max_seqlen_q == params.max_seqlen_kv == expected["max_seqlen"]
    # A sample of one token is a segment too; a sequence without padding ends at its last sample.
    assert boundaries_of(torch.tensor([[0, 0, 1, 2], [0, 1, 0, 1]])).tolist() == [0, 1, 4, 6, 8]


def test_every_model_chunk_of_a_rank_reads_each_microbatch_once():
    """Packed sequences with virtual pipeline stages: several chunks of one rank read the same microbatches."""
    from recipes.trainer.data import ChunkViews

    class Source:
        def __init__(self):
            self.read, self.closed = 0, 0

        def __next__(self):
            self.read += 1
            return self.read

        def close(self):
            self.closed += 1

    source = Source()
    first, second = ChunkViews(source, 2).views()
    assert [next(first), next(first), next(second), next(first), next(second), next(second)] == [1, 2, 1, 3, 2, 3]
    assert source.read == 3
    first.close()
    assert source.closed == 1


def test_the_schedule_sees_a_packed_microbatch_as_one_sequence():
    pytest.importorskip("megatron.core")
    from recipes.trainer.steps import schedule_shape

    plan = SimpleNamespace(seq_length=8192, micro_batch_size=2)
    assert schedule_shape(plan, packing=False) == (8192, 2)
    assert schedule_shape(plan, packing=True) == (16384, 1)


def test_a_fine_tuning_step_reports_its_trained_tokens():
    from recipes.trainer import metrics

    plan = SimpleNamespace(
        global_batch_size=8, seq_length=1024, model_flops_per_sample=1e12, num_gpus=2, peak_flops_per_gpu=None
    )
    record = metrics.step_metrics(
        plan, step=3, loss=2.0, lr=1e-4, grad_norm=1.0, step_time_s=0.5, consumed_samples=24, trained_tokens=3000
    )
    assert record.tokens_per_s == 8 * 1024 / 0.5 and record.trained_tokens_per_s == 6000
    assert "trained_tokens_per_s=6000" in metrics.progress_line(record, 10)
    from recipes.observability.tracking import scalars

    assert scalars(record)["perf/trained_tokens_per_s"] == 6000  # TensorBoard and W&B
    plain = metrics.step_metrics(plan, step=3, loss=2.0, lr=1e-4, grad_norm=1.0, step_time_s=0.5, consumed_samples=24)
    assert plain.trained_tokens_per_s is None and "trained_tokens" not in metrics.progress_line(plain, 10)
    assert "perf/trained_tokens_per_s" not in scalars(plain)


def test_the_trainer_builds_sft_data_from_the_config(tmp_path):
    """recipes/trainer/data.py's entry: training.data.format=sft reads the blend as samples with loss masks."""
    pytest.importorskip("megatron.core")
    from common.typed import changed
    from launcher.config.compose import compose
    from recipes.trainer.data import build_datasets

    prefix = write_prepared(tmp_path / "s_sft_document", [A, B, C] * 4)
    changes = {
        "training.data.format": "sft",
        "training.data.mock": False,
        "training.data.blend": [prefix],
        "training.data.split": "10,2,0",
        "training.data.packing": False,
        "training.train_steps": 3,
        "training.val_interval": 1,
        "training.val_samples": 2,
    }
    cfg = changed(compose([]), changes)
    plan = SimpleNamespace(seq_length=8, global_batch_size=2)
    train, valid = build_datasets(cfg, plan, SimpleNamespace(eod=PAD), build_here=True, cache_dir=str(tmp_path))
    assert len(train) == 6 and valid is not None and len(valid) == 2
    assert set(train[0]) >= {"tokens", "labels", "loss_mask", "position_ids"}
    assert build_datasets(cfg, plan, SimpleNamespace(eod=PAD), build_here=False, cache_dir="") == (None, None)
