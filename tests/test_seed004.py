"""Seed 004's experiments end to end without a change to compare, report or sweep: its built-in suites at both
scales, and the report's two views of it (throughput against batch size per system; epoch 1 against the steady
epochs) drawn from real BERT records of this CPU and copies of them for what one CPU cannot produce."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from core_support import RealRuns, accelbench, derived

from accelbench.compare import compare, load_records
from accelbench.sweep import builtin_suites, load_sweep

SUITES = ("seed004-batch-size", "seed004-scaling", "seed004-epochs", "seed004-models")
VISION = {"resnet50", "efficientnet-b0", "mobilenet-v3-small", "mobilenet-v3-large"}


def test_seed004_suites_at_both_scales() -> None:
    suites = builtin_suites()
    seed = {name: load_sweep(suites[name]) for name in SUITES}
    tiny = {name: load_sweep(suites[name], scale="tiny") for name in SUITES}

    batches = seed["seed004-batch-size"].points
    assert all(p.values["workload"] == "resnet50" for p in batches)
    assert [p.values["batch_size"] for p in batches] == [2, 4, 8, 16, 20, 32, 64, 128, 256, 512]
    scaling = seed["seed004-scaling"].points
    assert {p.values["devices"] for p in scaling} == {1, 2, 4, 8, 16}
    assert {p.values.get("data_workers") for p in scaling if p.values["devices"] == 8} == {None, 1, 2, 4, 8}
    epochs = seed["seed004-epochs"].points
    assert {p.values["workload"] for p in epochs} == VISION | {"bert"}
    assert {p.values["compile"] for p in epochs} == {False, True}
    models = seed["seed004-models"].points
    assert {(p.values["workload"], p.values["synthetic"]) for p in models} == {
        (w, s) for w in VISION | {"bert"} for s in ("host", "device")
    }
    # every point is a configuration `accelbench run` accepts (the workload's own default size where none is given)
    configs = [sweep.config(p, Path("out")) for sweep in seed.values() for p in sweep.points]
    assert {c.model for c in configs if c.workload in VISION} == VISION
    assert {c.model for c in configs if c.workload == "bert"} == {"bert-base"}

    for name, sweep in tiny.items():  # CPU sizes: small images, bert-tiny, a few steps
        configs = [sweep.config(p, Path("out")) for p in sweep.points]
        assert configs and all(c.steps_per_epoch and c.steps_per_epoch <= 3 for c in configs), name
        assert all(c.workload_options["image_size"] == 32 for c in configs if c.workload in VISION), name
        assert all(c.model == "bert-tiny" for c in configs if c.workload == "bert"), name


@pytest.fixture(scope="module")
def records(real_runs: RealRuns, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real bert-tiny runs (host pipeline and batches made on the device), and copies of the host run at other
    batch sizes on two systems."""
    root = tmp_path_factory.mktemp("seed004")
    real = real_runs.folder(
        *(["--workload", "bert", "--model", "bert-tiny", "--seq-len", "32", "--batch-size", "4", "--epochs", "3",
           "--steps-per-epoch", "3", "--data-workers", "0", "--synthetic", synthetic] for synthetic in ("host", "device"))
    )  # fmt: skip
    shutil.copytree(real, root / "real")
    host = next(
        r
        for p in (root / "real").glob("*.json")
        if (r := json.loads(p.read_text()))["data"].get("workers") == 0
    )
    (root / "derived").mkdir()
    for system, peak_batch in (("gpu-node", 16), ("ipu-node", 4)):
        for batch in (4, 8, 16):
            factor = 1.0 if batch == peak_batch else 0.6  # each system peaks at its own batch size
            epochs = [dict(e, samples_per_s=e["samples_per_s"] * factor, wall_s=e["wall_s"] / factor)
                      for e in host["metrics"]["epochs"]]  # fmt: skip
            record = derived(host, system__host=system, config__batch_size=batch, metrics__epochs=epochs,
                             metrics__warmup=epochs[0])  # fmt: skip
            (root / "derived" / f"{system}-{batch}.json").write_text(json.dumps(record))
    return root


def test_compare_puts_the_host_pipeline_beside_batches_made_on_the_device(records: Path) -> None:
    proc = accelbench("compare", str(records / "real"), "--vs", "data_source", "--format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = json.loads(proc.stdout)["groups"]
    assert len(groups) == 1 and groups[0]["workload"]["workload"] == "bert"
    assert {c["value"] for c in groups[0]["cells"]} == {"synthetic-host", "synthetic-device"}


def test_the_report_draws_seed004s_views_for_any_workload(records: Path) -> None:
    pytest.importorskip(
        "matplotlib", reason="accelbench report needs matplotlib (pip install 'accelbench[report]')"
    )
    from accelbench.report import build_report
    from accelbench.report.entries import entries
    from accelbench.report.figures import warmup_samples_per_s

    comparison = compare(load_records([records / "derived"]), label_by=("host",))
    titles = [f.title for f in build_report(comparison).figures]
    assert "Throughput against batch size: bert bert-tiny fp32 single" in titles
    assert "Epoch 1 against the steady epochs" in titles  # small multiples: a panel per workload and batch
    for entry in entries(comparison):  # epoch 1's throughput: an epoch's samples over epoch 1's time
        run = entry.cell.ok_runs[0].figures
        assert run is not None and run.warmup_s
        assert warmup_samples_per_s(entry) == pytest.approx(12 / run.warmup_s)
