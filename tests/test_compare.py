"""`accelbench compare` on records of real short CPU runs of two "systems" (one and two torch threads)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import shutil
import statistics
import uuid
from pathlib import Path

import pytest
from core_support import TINY, RealRuns, derived

from accelbench.cli import main
from accelbench.compare import (
    Filters,
    compare,
    environment_differences,
    load_records,
    mann_whitney_p,
    smallest_p,
    system_label,
)
from accelbench.errors import AccelbenchError, ResultFileError

STEADY_EPOCHS = 4  # with 4 vs 4 epochs the test can reach p = 2/70 < 0.05


@pytest.fixture(scope="module")
def nodes(real_runs: RealRuns) -> dict[str, Path]:
    """Two folders of real records, as copied from two nodes: node-a ran with 1 thread, node-b with 2."""
    return {
        name: real_runs.folder(
            [*TINY, "--epochs", str(STEADY_EPOCHS + 1), "--steps-per-epoch", "3", "--threads", threads],
            name=name,
        )
        for name, threads in (("node-a", "1"), ("node-b", "2"))
    }


def only_json(folder: Path) -> dict:
    (path,) = folder.glob("*.json")
    return json.loads(path.read_text())


def permutation_p(a: list[float], b: list[float]) -> float:
    """Brute force: the share of all relabellings whose U is at least as extreme as the observed one."""
    pooled, n1 = a + b, len(a)

    def u(x: list[float], y: list[float]) -> float:
        return sum(1.0 if i > j else 0.5 if i == j else 0.0 for i in x for j in y)

    observed = abs(u(a, b) - n1 * len(b) / 2)
    extreme = total = 0
    for idx in itertools.combinations(range(len(pooled)), n1):
        x = [pooled[i] for i in idx]
        y = [pooled[i] for i in range(len(pooled)) if i not in idx]
        total += 1
        extreme += abs(u(x, y) - n1 * len(b) / 2) >= observed - 1e-12
    return extreme / total


@pytest.mark.slow
def test_two_systems_side_by_side_with_ratios_noise_and_environment(nodes: dict[str, Path]) -> None:
    a, b = only_json(nodes["node-a"]), only_json(nodes["node-b"])
    comparison = compare(load_records([nodes["node-a"], nodes["node-b"]]))

    assert comparison.systems == [
        f"{a['system']['host']} · cpu · {a['backend']['devices'][0]['name']} · threads=1",
        f"{b['system']['host']} · cpu · {b['backend']['devices'][0]['name']} · threads=2",
    ]
    assert comparison.baseline == comparison.systems[0]  # the first system, by default
    (group,) = comparison.groups  # same workload on both: one group, two cells
    assert (
        group.key.model == "custom 1L/2H/16E" and group.key.batch_size == 8 and group.key.steps_per_epoch == 3
    )
    base, other = group.cells
    assert (base.system, other.system) == tuple(comparison.systems)
    assert base.baseline is None and other.baseline is not None

    # the figures, recomputed from the record files themselves
    walls_a = [e["wall_s"] for e in a["metrics"]["epochs"][1:]]
    walls_b = [e["wall_s"] for e in b["metrics"]["epochs"][1:]]
    assert base.epoch_s.median == pytest.approx(a["metrics"]["steady"]["epoch_s_median"])
    assert base.epoch_s.n == STEADY_EPOCHS
    ratio = other.baseline
    assert ratio.speedup == pytest.approx(statistics.median(walls_a) / statistics.median(walls_b))
    assert ratio.throughput_ratio == pytest.approx(
        b["metrics"]["steady"]["samples_per_s"] / a["metrics"]["steady"]["samples_per_s"]
    )
    assert ratio.memory_ratio == pytest.approx(
        b["metrics"]["peak_memory_max_bytes"] / a["metrics"]["peak_memory_max_bytes"]
    )
    assert ratio.p_value == pytest.approx(permutation_p(walls_b, walls_a))
    assert ratio.measurements == (STEADY_EPOCHS, STEADY_EPOCHS)
    assert ratio.verdict == ("beyond noise" if ratio.p_value < 0.05 else "within noise")
    # no CPU peak table: MFU is against the measured dense-matmul rate (labelled so in the record)
    assert base.mfu is not None and 0 < base.mfu.median < 1
    assert a["metrics"]["peak"]["source"].startswith("measured: dense matmul")

    # what differs: the threads; what does not (same machine, same software) is not listed
    diff = dict(comparison.environment)
    assert diff["torch threads"] == {comparison.systems[0]: ["1"], comparison.systems[1]: ["2"]}
    assert "torch" not in diff and "accelbench" not in diff and "device unit" not in diff


def test_baseline_choice_labels_and_filters(nodes: dict[str, Path]) -> None:
    records = load_records([nodes["node-a"], nodes["node-b"]])
    by_dir = compare(records, label_by=("dir",), baseline="node-b")
    assert by_dir.systems == ["node-a", "node-b"] and by_dir.baseline == "node-b"
    a_cell = next(c for c in by_dir.groups[0].cells if c.system == "node-a")
    default = compare(records)
    b_cell = next(c for c in default.groups[0].cells if c.baseline is not None)
    assert a_cell.baseline.speedup == pytest.approx(1 / b_cell.baseline.speedup)

    only_b = compare(records, filters=Filters(systems=("threads=2",)))
    assert len(only_b.systems) == 1 and only_b.groups[0].cells[0].baseline is None
    with pytest.raises(AccelbenchError, match="no result records matched the filters"):
        compare(records, filters=Filters(precisions=("bf16-mixed",)))
    with pytest.raises(AccelbenchError, match=r"--baseline 'node' matches 2 systems"):
        compare(records, label_by=("dir",), baseline="node")
    with pytest.raises(
        AccelbenchError, match=r"--baseline 'node-z' matches no system; the systems are: node-a; node-b"
    ):
        compare(records, label_by=("dir",), baseline="node-z")


def test_every_output_format_from_the_command_line(nodes: dict[str, Path], capsys) -> None:
    dirs = [str(nodes["node-a"]), str(nodes["node-b"])]
    assert main(["compare", *dirs, "--label-by", "dir", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["systems"] == ["node-a", "node-b"] and data["baseline"] == "node-a"
    cells = data["groups"][0]["cells"]
    assert cells[0]["vs_baseline"] is None and cells[1]["vs_baseline"]["speedup"] > 0
    assert data["environment_differences"][0]["attribute"] == "torch threads"

    assert main(["compare", *dirs, "--label-by", "dir", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["system"] for r in rows] == ["node-a", "node-b"]
    assert float(rows[1]["speedup_vs_baseline"]) == pytest.approx(cells[1]["vs_baseline"]["speedup"])
    assert rows[0]["speedup_vs_baseline"] == "" and rows[0]["scaling_speedup"] == ""  # unknown: empty, not 0
    assert float(rows[0]["predicted_step_s"]) > 0 and float(rows[0]["step_s"]) > 0  # the records' predictions

    assert main(["compare", *dirs, "--label-by", "dir", "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert (
        "| system | devices | runs |" in markdown and "| node-b | 1 | 1 ok" in markdown
    )  # "(1 contended)" on a busy host
    assert "## What differs between the environments" in markdown and "| torch threads | 1 | 2 |" in markdown

    assert main(["compare", *dirs, "--label-by", "dir", "--model", "gpt2"]) == 2
    assert "no result records matched the filters" in capsys.readouterr().err
    assert main(["compare", *dirs, "--label-by", "hostname"]) == 2
    assert "unknown field(s) 'hostname'; choose from: host," in capsys.readouterr().err


def test_tokens_per_second_is_shown_for_language_models_only(
    nodes: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """A GPT's sample is a sequence: compare shows tokens/s (samples/s times the sequence length) beside samples/s.
    Where a sample is one token's worth (an image), the column would repeat samples/s and is left out."""
    record = only_json(nodes["node-a"])
    assert main(["compare", str(nodes["node-a"]), "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    header = next(line for line in markdown.splitlines() if line.startswith("| system"))
    assert "| samples/s | tokens/s |" in header
    assert main(["compare", str(nodes["node-a"]), "--format", "json"]) == 0
    cell = json.loads(capsys.readouterr().out)["groups"][0]["cells"][0]
    seq_len = record["metrics"]["epochs"][0]["tokens"] / record["metrics"]["epochs"][0]["samples"]
    assert seq_len > 1 and cell["tokens_per_s"]["median"] == pytest.approx(
        cell["samples_per_s"]["median"] * seq_len
    )

    for epoch in record["metrics"]["epochs"]:  # the same run counted as one token a sample
        epoch["tokens"], epoch["tokens_per_s"] = epoch["samples"], epoch["samples_per_s"]
    record["metrics"]["steady"]["tokens_per_s"] = record["metrics"]["steady"]["samples_per_s"]
    (tmp_path / "one-token.json").write_text(json.dumps(record))
    assert main(["compare", str(tmp_path), "--format", "markdown"]) == 0
    assert "tokens/s" not in capsys.readouterr().out


def test_bad_files_are_named_and_skipped_or_fatal_with_strict(
    nodes: dict[str, Path], tmp_path: Path, capsys
) -> None:
    folder = tmp_path / "gathered"
    shutil.copytree(nodes["node-a"], folder / "a")
    shutil.copytree(nodes["node-a"], folder / "copy-of-a")  # the same run gathered twice counts once
    record = only_json(nodes["node-b"])
    (folder / "garbage.json").write_text("{ not json")
    (folder / "foreign.json").write_text('{"name": "some other tool"}')
    newer = dict(record, schema_version=99, run_id=uuid.uuid4().hex)
    (folder / "newer.json").write_text(json.dumps(newer))
    (folder / ".tmp-half-written.json").write_text("{")  # an atomic write in progress is not looked at
    (folder / "notes.txt").write_text("not a record, not a .json file")

    loaded = load_records([folder])
    assert len(loaded.records) == 1 and len(loaded.duplicates) == 1
    skipped = {p.name: reason for p, reason in loaded.skipped}
    assert set(skipped) == {"garbage.json", "foreign.json", "newer.json"}
    assert "not JSON" in skipped["garbage.json"]
    assert "not an accelbench result record" in skipped["foreign.json"]
    assert "schema v99, newer than this accelbench reads" in skipped["newer.json"]

    assert main(["compare", str(folder), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "garbage.json" in captured.err and "newer.json" in captured.err
    assert {Path(s["path"]).name for s in json.loads(captured.out)["skipped"]} == set(skipped)

    with pytest.raises(ResultFileError, match="foreign.json: not an accelbench result record"):
        load_records([folder], strict=True)  # the first bad file, in path order, ends it
    assert main(["compare", str(folder), "--strict"]) == 2
    assert "foreign.json: not an accelbench result record" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such file or directory" in capsys.readouterr().err


def test_scaling_and_out_of_memory_cells(nodes: dict[str, Path], tmp_path: Path) -> None:
    record = only_json(nodes["node-a"])
    steady = record["metrics"]["steady"]
    folder = tmp_path / "scaling"
    folder.mkdir()
    # the same workload at 1, 2 and 4 devices: throughput 1x, 1.8x, 3.0x of the real run's
    for devices, factor in ((1, 1.0), (2, 1.8), (4, 3.0)):
        epochs = [dict(e, samples_per_s=e["samples_per_s"] * factor) for e in record["metrics"]["epochs"]]
        r = derived(
            record,
            config__devices=devices,
            backend__devices_used=devices,
            metrics__epochs=epochs,
            metrics__steady=dict(steady, samples_per_s=steady["samples_per_s"] * factor),
        )
        (folder / f"d{devices}.json").write_text(json.dumps(r))
    oom = derived(record, config__devices=8, backend__devices_used=8, metrics=None)
    oom["outcome"] = {"status": "oom", "message": "RuntimeError: out of memory", "traceback": None}
    (folder / "d8.json").write_text(json.dumps(oom))

    (group,) = compare(load_records([folder])).groups
    cells = {c.devices: c for c in group.cells}
    assert cells[1].scaling is None
    assert cells[2].scaling.speedup == pytest.approx(1.8) and cells[2].scaling.efficiency == pytest.approx(
        0.9
    )
    assert cells[4].scaling.speedup == pytest.approx(3.0) and cells[4].scaling.efficiency == pytest.approx(
        0.75
    )
    assert cells[8].failure() == "OOM" and cells[8].epoch_s is None and cells[8].scaling is None


def test_an_unfair_comparison_is_visible(nodes: dict[str, Path], tmp_path: Path) -> None:
    """fp32 that ran as TF32 on a GPU system against IEEE fp32 on the CPU: the environment table says so."""
    record = only_json(nodes["node-a"])
    gpu = derived(
        record,
        system__host="gpu-node-7",
        system__torch_cuda="12.8",
        precision__matmul_math="tf32",
        backend__info__device_unit="GPU",
        backend__collective_backend="nccl",
    )
    (tmp_path / "gpu.json").write_text(json.dumps(gpu))
    loaded = load_records([nodes["node-a"], tmp_path / "gpu.json"])
    labelled = [(system_label(r), r) for r in loaded.records]
    diff = dict(environment_differences(labelled, [label for label, _ in labelled]))
    cpu_label, gpu_label = (label for label, _ in labelled)
    assert "matmul ieee-fp32" in diff["precision fp32"][cpu_label][0]
    assert "matmul tf32" in diff["precision fp32"][gpu_label][0]
    assert diff["device unit"][gpu_label] == ["GPU"]
    assert diff["collective backend"] == {cpu_label: ["none"], gpu_label: ["nccl"]}
    assert diff["torch"][gpu_label][0].endswith("(CUDA 12.8)")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([3.0, 1.0, 2.0], [5.0, 4.0, 6.0, 0.5]),
        ([1.0, 2.0, 2.0, 9.0], [2.0, 3.0, 4.0, 5.0]),
        ([1.0, 2.0], [3.0, 4.0, 5.0, 6.0, 7.0]),
    ],
)
def test_mann_whitney_matches_brute_force(a: list[float], b: list[float]) -> None:
    assert mann_whitney_p(a, b) == pytest.approx(permutation_p(a, b))
    assert smallest_p(2, 2) == pytest.approx(1 / 3)  # 2 vs 2 epochs can never be called beyond the noise
    assert mann_whitney_p([1.0, 2.0], [3.0, 4.0]) == pytest.approx(1 / 3)


def test_mann_whitney_normal_approximation_for_large_samples(monkeypatch) -> None:
    import random

    from accelbench.compare import stats as compare_module

    rng = random.Random(0)
    a = [round(rng.gauss(10.0, 1.0), 1) for _ in range(30)]  # rounded: plenty of ties
    b = [round(rng.gauss(10.6, 1.0), 1) for _ in range(30)]
    approximate = mann_whitney_p(a, b)  # 30 x 30 is over the exact limit
    monkeypatch.setattr(compare_module, "_EXACT_LIMIT", 10**9)
    exact = mann_whitney_p(a, b)
    assert 0.001 < exact < 0.5 and approximate == pytest.approx(exact, rel=0.1)


def test_mann_whitney_with_every_value_tied() -> None:
    """Thousands of copies of one record: every epoch time the same, over the exact limit; nothing separates them."""
    assert mann_whitney_p([0.5] * 30, [0.5] * 30) == 1.0
