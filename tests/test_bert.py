"""The BERT workload (seed 004's language model): real masked-language-model training on the CPU, single and 2-process
DDP, on synthetic sequences or text given as files; its FLOPs formula against torch's FLOP counter; BERT's masking;
both tokenisers; bad requests refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from core_support import accelbench, run_here

from accelbench.config import RunConfig
from accelbench.errors import ConfigError
from accelbench.plugins import get_host
from accelbench.results import read_record
from accelbench.workloads.bert import MODEL_SIZES, bert_units, predicted_positions
from accelbench.workloads.bert.data import (
    BUILTIN_IDS,
    FIRST_WORD_ID,
    HashingTokenizer,
    MaskedSequences,
    WordPieceTokenizer,
    open_text,
    random_masked,
)
from accelbench.workloads.bert.model import BertConfig, BertMLM

TINY = ["--workload", "bert", "--model", "bert-tiny", "--seq-len", "32", "--batch-size", "4", "--epochs", "2",
        "--steps-per-epoch", "2", "-q"]  # fmt: skip
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "un", "##happi", "##ly", ".",
         ","]  # fmt: skip


def only_record(folder: Path):  # type: ignore[no-untyped-def]
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return read_record(files[0])


@pytest.mark.slow
def test_bert_trains_on_the_cpu(tmp_path: Path) -> None:
    proc = accelbench("run", *TINY, "--data-workers", "1", "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(tmp_path)
    m = record.metrics
    assert record.outcome.status == "ok" and m is not None and [e.steps for e in m.epochs] == [2, 2]
    assert all(e.tokens == 32 * e.samples for e in m.epochs)  # tokens per sample: the sequence length
    assert m.epochs[0].loss == pytest.approx(
        np.log(30522), rel=0.05
    )  # an untrained MLM: uniform over the vocabulary
    assert record.workload["predicted_per_sequence"] == 4 == predicted_positions(32, 0.15)
    assert record.workload_identity["model"] == "bert-tiny" and record.workload_identity["seq_len"] == 32
    assert record.executor["optimizer"] == "AdamW" and record.executor["grad_clip_norm"] == 1.0


def test_the_default_size_is_bert_base() -> None:
    config = get_host().resolve(RunConfig(workload="bert"))
    assert config.model == "bert-base" and config.workload_options["seq_len"] == 128


def test_flops_formula_is_three_forward_passes_counted_by_torch() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    n_layer, n_head, n_embd = MODEL_SIZES["bert-mini"]
    model = BertMLM(BertConfig(n_layer, n_head, n_embd, vocab_size=1000, dropout=0.0, vocab_multiple=1))
    seq_len, predicted = 64, 9
    ids = torch.randint(FIRST_WORD_ID, 1000, (2, seq_len))
    positions = torch.stack([torch.randperm(seq_len - 2)[:predicted].sort().values + 1 for _ in range(2)])
    targets = torch.stack([positions, ids.gather(1, positions)], dim=1)
    counter = FlopCounterMode(display=False)
    # the math kernel: the counter knows its matmuls (it has no formula for the CPU's fused attention kernel)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(ids, targets)
    # the formula's 6N counts biases and LayerNorm too, which the counter (matmuls only) does not
    assert model.flops_per_sequence(seq_len, predicted) == pytest.approx(
        3 * counter.get_total_flops() / 2, rel=0.01
    )


def test_bert_base_and_large_have_their_published_sizes() -> None:
    for name, millions in (("bert-base", 109.5), ("bert-large", 335.1)):
        n_layer, n_head, n_embd = MODEL_SIZES[name]
        with torch.device("meta"):
            model = BertMLM(BertConfig(n_layer, n_head, n_embd, vocab_size=30522, vocab_multiple=64))
        # Devlin et al.'s 110M / 340M, less the pooler and next-sentence head this pre-training leaves out
        assert model.num_parameters() / 1e6 == pytest.approx(millions, rel=0.01), name


def test_units_name_the_parts_of_the_model() -> None:
    model = BertMLM(BertConfig(2, 2, 32, vocab_size=100))
    units = bert_units(2)
    modules = dict(model.named_modules())
    assert all(p in modules for p in (*units.stem, *units.units, *units.head, *units.split_points))
    assert model.get_parameter(units.tied[0][0]) is model.get_parameter(units.tied[0][1])


def test_masking_is_berts_and_deterministic_per_sample() -> None:
    dataset = MaskedSequences(None, 30522, seq_len=64, predicted=9, seed=5, synthetic_samples=100)
    ids, targets = dataset[(0, 7)]
    again, same = dataset[(0, 7)]
    assert torch.equal(ids, again) and torch.equal(targets, same)
    assert not torch.equal(ids, dataset[(1, 7)][0])  # another epoch, another masking
    assert ids[0] == BUILTIN_IDS["[CLS]"] and ids[-1] == BUILTIN_IDS["[SEP]"] and ids.shape == (64,)
    positions, labels = targets
    assert targets.shape == (2, 9) and len(set(positions.tolist())) == 9
    assert positions.min() >= 1 and positions.max() <= 62  # never [CLS] or [SEP]
    # over many samples: 80% of predicted positions are [MASK], 10% another token, 10% unchanged
    masked = kept = total = 0
    for index in range(100):
        ids, (positions, labels) = dataset[(0, index)]
        masked += int((ids[positions] == BUILTIN_IDS["[MASK]"]).sum())
        kept += int((ids[positions] == labels).sum())
        total += len(positions)
    assert masked / total == pytest.approx(0.8, abs=0.05) and kept / total == pytest.approx(0.1, abs=0.04)


def test_device_batches_have_the_same_shapes_and_masking() -> None:
    make = random_masked(seq_len=32, predicted=4, vocab_size=30522)
    ids, targets = make(torch.Generator().manual_seed(0), 8, torch.device("cpu"))
    assert ids.shape == (8, 32) and targets.shape == (8, 2, 4)
    assert (ids[:, 0] == BUILTIN_IDS["[CLS]"]).all() and (ids[:, -1] == BUILTIN_IDS["[SEP]"]).all()
    assert ((targets[:, 0] >= 1) & (targets[:, 0] <= 30)).all()


def test_tokenisers() -> None:
    builtin = HashingTokenizer()
    ids = builtin.encode("The cat, the CAT.")
    assert (
        len(ids) == 6
        and ids[0] == ids[3]
        and ids[1] == ids[4]
        and all(FIRST_WORD_ID <= i < 30522 for i in ids)
    )


def test_wordpiece_from_a_vocab_file(tmp_path: Path) -> None:
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tokenizer = WordPieceTokenizer(tmp_path / "vocab.txt")
    assert tokenizer.encode("The cat sat, unhappily!") == [5, 6, 7, 14, 10, 11, 12, 1]  # "!" is unknown
    (tmp_path / "bad.txt").write_text("the\ncat\n")
    with pytest.raises(ConfigError, match=r"lacks \[PAD\], \[UNK\], \[CLS\], \[SEP\], \[MASK\]"):
        WordPieceTokenizer(tmp_path / "bad.txt")


@pytest.mark.slow
def test_a_run_on_a_folder_of_text_with_a_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "text").mkdir()
    for i in range(2):
        (tmp_path / "text" / f"part{i}.txt").write_text(
            "the cat sat on the mat. unhappily, the cat sat.\n" * 20
        )
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    text = open_text(tmp_path / "text", tmp_path / "vocab.txt", seq_len=32)
    assert text.files == 2 and text.vocab_size == len(VOCAB) and len(text.tokens) == 2 * 20 * 15
    out = tmp_path / "out"
    assert run_here(*TINY, "--data", str(tmp_path / "text"), "--tokenizer", str(tmp_path / "vocab.txt"),
                    "--data-workers", "0", "--output-dir", str(out)) == 0  # fmt: skip
    record = only_record(out)
    # ceil(600 / 30) = 20 windows, the last 10% (2) held out for validation: 18 train
    assert record.data["tokens"] == 600 and record.data["samples_per_epoch"] == 18
    assert record.data["tokenizer"].startswith("WordPiece (vocab.txt, 15 tokens)")
    assert record.workload["vocab_size"] == 15 and record.workload_identity["data_source"] == "dataset"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"model": "bert-huge"}, "unknown model 'bert-huge' for workload 'bert'; choose one of: bert-base"),
        (
            {"workload_options": {"seq_len": 1024}},
            "--seq-len 1024 is above bert-tiny's maximum of 512 tokens",
        ),
        ({"workload_options": {"tokenizer": "vocab.txt"}}, "--tokenizer tokenises --data text"),
        ({"batch_size": 6, "grad_accum": 4}, "--batch-size 6 is not divisible by --grad-accum 4"),
        ({"workload_options": {"synthetic": "gpu"}}, "--synthetic: Input should be one of host, device"),
    ],
)
def test_bad_requests_are_refused(values: dict, message: str) -> None:  # type: ignore[type-arg]
    config = RunConfig(**{"workload": "bert", "model": "bert-tiny", **values})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        get_host().resolve(config)


@pytest.mark.slow
def test_fsdp_on_two_processes_with_gradient_accumulation(tmp_path: Path) -> None:
    proc = accelbench("run", *TINY, "--strategy", "fsdp", "--devices", "2", "--grad-accum", "2",
                      "--data-workers", "0", "--output-dir", str(tmp_path))  # fmt: skip
    record = only_record(tmp_path)
    assert record.outcome.status == "ok", (record.outcome, proc.stderr[-2000:])
    assert (
        record.world_size == 2
        and record.executor["strategy"] == "fsdp"
        and record.executor["grad_accum"] == 2
    )
    assert [r.epoch_samples for r in record.metrics.ranks] == [[8, 8], [8, 8]]


@pytest.mark.slow
def test_ddp_on_two_processes(tmp_path: Path) -> None:
    proc = accelbench("run", *TINY, "--strategy", "ddp", "--devices", "2", "--data-workers", "0",
                      "--output-dir", str(tmp_path))  # fmt: skip
    record = only_record(tmp_path)
    assert record.outcome.status == "ok", (record.outcome, proc.stderr[-2000:])
    assert record.world_size == 2 and record.executor["strategy"] == "ddp"


@pytest.mark.slow
def test_tensor_and_pipeline_parallel_bert_train_the_same_model(tmp_path: Path) -> None:
    """BERT under tp=2 (its Megatron plan) and pp=2 (its layers dealt to two stages) on two gloo processes: the
    same batches give the same losses, since neither changes the maths."""
    losses = {}
    for mesh in ("tp=2", "pp=2"):
        out = tmp_path / mesh
        proc = accelbench("run", "--workload", "bert", "--model", "bert-tiny", "--seq-len", "16", "--batch-size", "4",
                          "--dropout", "0", "--data-workers", "0", "--mesh", mesh, "--devices", "2", "--epochs", "2",
                          "--steps-per-epoch", "2", "--output-dir", str(out), "-q")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        record = read_record(next(out.glob("*.json")))
        assert record.outcome.status == "ok" and record.config.strategy == mesh[:2]
        assert ("tensor_parallel" if mesh == "tp=2" else "pipeline") in record.executor
        losses[mesh] = [e.loss for e in record.metrics.epochs]
    assert losses["tp=2"] == pytest.approx(losses["pp=2"], rel=1e-4)
