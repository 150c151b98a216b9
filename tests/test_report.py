"""`accelbench report`: one self-contained HTML file with the seed study's views, from real CPU records (and
copies of them changed where a CPU cannot produce the data: device counts, strategies, an IPU's compile step)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from core_support import TINY, RealRuns, derived

from accelbench.cli import main
from accelbench.compare import compare, load_records

pytest.importorskip(
    "matplotlib", reason="accelbench report needs matplotlib (pip install 'accelbench[report]')"
)

from accelbench.report import build_report, write_report  # noqa: E402

HOSTILE_HOST = '<script>alert("host")</script> $x_1$ & co'


@pytest.fixture(scope="module")
def results(real_runs: RealRuns, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real records of two precisions on this CPU, plus derived records for the views a CPU cannot fill."""
    root = tmp_path_factory.mktemp("report-results")
    real = real_runs.folder(
        *([*TINY, "--precision", precision, "--epochs", "3", "--steps-per-epoch", "3"]
          for precision in ("fp32", "bf16-mixed"))
    )  # fmt: skip
    shutil.copytree(real, root / "real")
    fp32 = next(
        json.loads(p.read_text())
        for p in (root / "real").glob("*.json")
        if json.loads(p.read_text())["config"]["precision"] == "fp32"
    )
    derived_dir = root / "derived"
    derived_dir.mkdir()

    def write(name: str, record: dict) -> None:
        (derived_dir / f"{name}.json").write_text(json.dumps(record))

    def as_model(model: str, parameters: int, **changes: object) -> dict:
        options = {
            k: v
            for k, v in fp32["config"]["workload_options"].items()
            if k not in ("n_layer", "n_head", "n_embd")
        }
        return derived(
            fp32,
            config__model=model,
            config__workload_options=options,
            workload_identity__model=model,
            workload__parameters=parameters,
            **changes,
        )

    def scaled(record: dict, time: float = 1.0, memory: float = 1.0) -> dict:
        """Epoch times x ``time`` (throughput / ``time``), peak memory x ``memory``: a plausible other result."""
        m = record["metrics"]
        epochs = [
            dict(
                e,
                wall_s=e["wall_s"] * time,
                samples_per_s=e["samples_per_s"] / time,
                tokens_per_s=e["tokens_per_s"] / time,
            )
            for e in m["epochs"]
        ]
        steady = dict(m["steady"])
        for name in ("epoch_s_median", "epoch_s_min", "epoch_s_max"):
            steady[name] *= time
        for name in ("samples_per_s", "tokens_per_s", "achieved_flops_per_s"):
            steady[name] /= time
        metrics = dict(m, epochs=epochs, warmup=epochs[0], steady=steady)
        metrics["peak_memory_max_bytes"] = int(m["peak_memory_max_bytes"] * memory)
        return dict(record, metrics=metrics)

    def oom(record: dict) -> dict:
        record = dict(record, metrics=None)
        record["outcome"] = {"status": "oom", "message": "CUDA <out of memory> & more", "traceback": None}
        return record

    # a hostile host name: everything from records must be escaped in HTML and be plain text in figures
    write("hostile", derived(fp32, system__host=HOSTILE_HOST))
    # a scaling series on 1, 2 and 4 devices (DDP), two batch sizes
    for devices in (1, 2, 4):
        for batch in (8, 16):
            record = derived(
                fp32,
                system__host="gpu-node",
                config__strategy="ddp",
                config__devices=devices,
                config__batch_size=batch,
                backend__devices_used=devices,
            )
            efficiency = 0.9 ** (devices.bit_length() - 1)
            time = (0.7 if batch == 16 else 1.0) / (devices * efficiency)
            write(f"ddp-{devices}-{batch}", scaled(record, time, 1.5 if batch == 16 else 1.0))
    # strategies across model sizes; the largest model does not fit with DDP
    for strategy, time, memory in (("ddp", 1.0, 1.0), ("fsdp", 0.85, 0.8), ("deepspeed-zero3", 2.4, 0.6)):
        small = as_model("gpt-nano", 100_000, system__host="gpu-node", config__strategy=strategy)
        write(f"{strategy}-nano", scaled(small, time, memory))
        big = as_model("gpt2-medium", 300_000_000, system__host="gpu-node", config__strategy=strategy)
        write(f"{strategy}-medium", oom(big) if strategy == "ddp" else scaled(big, 3 * time, 3.5 * memory))
    # IPU strategies with a compile step, on 1, 2 and 4 IPUs
    for strategy, compile_s, exponent in (("pipelined", 40.0, 0.8), ("sharded", 30.0, 0.05)):
        for devices in (1, 2, 4):
            record = derived(
                fp32,
                system__host="ipu-pod",
                backend__info__name="ipu",
                backend__info__device_unit="IPU",
                config__backend="ipu",
                config__strategy=strategy,
                config__devices=devices,
                backend__devices_used=devices,
                metrics__compile_s=compile_s * (1 + devices.bit_length() / 4),
            )
            write(f"ipu-{strategy}-{devices}", scaled(record, 3.0 / devices**exponent))
    return root


def test_the_report_has_every_view_with_figures_and_escapes_record_strings(results: Path) -> None:
    comparison = compare(load_records([results]), label_by=("host", "backend"))
    report = build_report(comparison, title="CPU & friends <test>")
    page = report.html

    titles = [f.title for f in report.figures]
    for expected in (
        "Every comparison at a glance: steady epoch time per system",
        "Epoch time per system and precision",
        "Scaling: custom 1L/2H/16E fp32 ddp on gpu-node · cpu",
        "Scaling: custom 1L/2H/16E fp32 pipelined on ipu-pod · ipu",
        "Peak memory against batch size: custom 1L/2H/16E ddp",
        "Peak memory against model size: fp32 ddp batch 8",
        "Strategies on 1 device(s): gpu-node · cpu",
        "Compile time and epoch time per strategy: custom 1L/2H/16E on ipu-pod · ipu",
    ):
        assert any(t.startswith(expected) for t in titles), (expected, titles)
    assert "No records for this view." not in page  # every view found its data

    # each figure is embedded as an SVG data URI: the file stands alone
    images = re.findall(r'<img alt="[^"]*" src="data:image/svg\+xml;base64,([^"]+)">', page)
    assert len(images) == len(report.figures)
    for data in images:
        svg = base64.b64decode(data).decode("utf-8")
        assert "<svg" in svg and "</svg>" in svg
    assert "http://" not in re.sub(r'xmlns(:\w+)?="http://[^"]+"|https?://www\.w3\.org[^"\s]*', "", page)

    # the largest-model table of the strategies that met an OOM
    assert "Largest model that fits" in page and "<td>out of memory</td>" in page

    # escaping: record strings never become markup
    assert "<script>" not in page and "&lt;script&gt;alert(&quot;host&quot;)&lt;/script&gt;" in page
    assert "CUDA &lt;out of memory&gt; &amp; more" in page
    assert "<title>CPU &amp; friends &lt;test&gt;</title>" in page
    # the hostile host is a system; its label reached a figure as plain text, mathtext off
    hostile_figure = next(f for f in report.figures if f.title.startswith("Epoch time per system"))
    assert "$x_1$" in hostile_figure.encode("svg").decode("utf-8").replace("&amp;", "&")


@pytest.mark.slow
def test_the_command_writes_html_and_figure_files(results: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.html"
    figures = tmp_path / "figures"
    code = main(["report", str(results), "-o", str(out), "--figures", str(figures), "--figure-format", "png"])
    assert code == 0, capsys.readouterr().err
    files = sorted(figures.iterdir())
    assert len(files) >= 6 and all(f.suffix == ".png" for f in files)
    assert all(f.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for f in files)
    page = out.read_text()
    assert page.count('src="data:image/png;base64,') == len(files)
    assert "report written to" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium to render the report headless")
@pytest.mark.slow
def test_the_report_renders_in_a_headless_browser(results: Path, tmp_path: Path) -> None:
    from PIL import Image

    comparison = compare(load_records([results]), label_by=("host", "backend"))
    page = tmp_path / "report.html"
    write_report(build_report(comparison), page, None, "svg")
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1400,3000",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), proc.stderr
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 3000)
    # a rendered page with tables and plots, not a blank or error page: many colours (the figures' lines and
    # bars), and ink over a good part of the page
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200
    non_white = sum(count for count, rgb in colours if sum(rgb) < 3 * 245)
    assert non_white > 0.03 * 1400 * 3000


@pytest.mark.slow
def test_the_report_along_precision_has_bars_per_precision_for_each_system(
    results: Path, tmp_path: Path
) -> None:
    """--vs precision: the seed study's figure 2 for each workload, from the real fp32 and bf16-mixed runs."""
    comparison = compare(load_records([results]), label_by=("host", "backend"), vs="precision")
    report = build_report(comparison)
    figure = next(
        f for f in report.figures if f.title == "Epoch time by precision: gpt custom 1L/2H/16E, single"
    )
    svg = figure.encode("svg").decode("utf-8")
    assert "fp32" in svg and "bf16-mixed" in svg and "speedup vs precision fp32" in svg
    page = report.html
    assert '<h2 id="vs">Along precision</h2>' in page and '<a href="#vs">Along precision</a>' in page
    assert "<th>precision</th>" in page and "<td>bf16-mixed</td>" in page and "<td>baseline</td>" in page
    assert page.count("<figure") == len(report.figures) > 6  # every other view is still there

    # energy per sample, where a record has it: a column of the comparison and a view of its own
    real = sorted((results / "real").glob("*.json"))
    record = json.loads(real[0].read_text())
    epochs = [
        dict(e, energy_j=3.0 * e["samples"], joules_per_sample=3.0) for e in record["metrics"]["epochs"]
    ]
    folder = tmp_path / "metered"
    folder.mkdir()
    (folder / "metered.json").write_text(
        json.dumps(derived(record, system__host="metered", metrics__epochs=epochs))
    )
    for path in real:
        shutil.copy(path, folder)
    out = tmp_path / "report.html"
    assert main(["report", str(folder), "--vs", "precision", "-o", str(out)]) == 0
    page = out.read_text()
    assert "<th>J/sample</th>" in page and '<h2 id="energy">Energy per sample</h2>' in page
    # the views this handful of runs cannot fill are left out, named once
    assert "Nothing to draw for these records:" in page and "No records for this view." not in page


@pytest.mark.slow
def test_one_colour_per_thing_small_multiples_and_a_figure_for_every_table(results: Path) -> None:
    """Every series drawn as bars has the colour of its precision, strategy or system in every figure; the
    overview has one panel per comparison table; no two figures share a title."""
    from matplotlib.colors import to_hex

    from accelbench.report.palette import PRECISION_COLOURS, STRATEGY_COLOURS, Palette

    comparison = compare(load_records([results]), label_by=("host", "backend"))
    report = build_report(comparison)
    palette = Palette(comparison.systems)
    seen: dict[str, set[str]] = {}
    for fig in report.figures:
        for ax in fig.figure.axes:
            for container in ax.containers:
                label = container.get_label()
                if getattr(container, "patches", None) and not label.startswith("_"):
                    seen.setdefault(label, set()).add(to_hex(container.patches[0].get_facecolor()))
    assert seen, "no bars drawn"
    for label, colours in seen.items():
        assert len(colours) == 1, (label, colours)  # one colour per thing, across every figure
        expected = PRECISION_COLOURS.get(label) or STRATEGY_COLOURS.get(label)
        if expected is None and label in comparison.systems:
            expected = palette.colour(label)
        if expected is not None:
            assert colours == {expected.lower()}, label
    overview = next(f for f in report.figures if f.title.startswith("Every comparison at a glance"))
    panels = [ax for ax in overview.figure.axes if ax.get_title()]
    assert len(panels) == len(comparison.groups)  # every table has its panel
    titles = [f.title for f in report.figures]
    assert len(titles) == len(set(titles)), titles  # titles say what differs between figures


def test_the_report_sets_the_time_to_target_beside_the_speed(tmp_path: Path, capsys) -> None:
    """Real tiny runs: one reaches --target-loss 3.5 (its time, epoch, steps and samples to it, beside its samples
    per second), one never reaches 0.01 (it says 'not reached' with its best loss), and a copy of the first that
    diverged has no valid figure. Energy: the CPU has no counter ('not measured'); a copy with a reading shows it."""
    quick = [
        *TINY,
        "--threads",
        "1",
        "--steps-per-epoch",
        "4",
        "--lr",
        "1e-2",
        "--output-dir",
        str(tmp_path),
        "-q",
    ]
    assert main(["run", *quick, "--epochs", "12", "--target-loss", "3.5"]) == 0
    assert main(["run", *quick, "--epochs", "2", "--target-loss", "0.01", "--batch-size", "4"]) == 0
    (reached,) = [
        json.loads(p.read_text())
        for p in tmp_path.glob("*.json")
        if json.loads(p.read_text())["quality"]["target"]["reached"]
    ]
    target = reached["quality"]["target"]
    metered = dict(target, energy_j=12.5)
    (tmp_path / "metered.json").write_text(
        json.dumps(derived(reached, system__host="metered", quality__target=metered))
    )
    diverged = {"status": "diverged", "message": "training diverged: the loss was nan", "traceback": None}
    (tmp_path / "diverged.json").write_text(
        json.dumps(derived(reached, system__host="broken", outcome=diverged))
    )
    capsys.readouterr()
    page = build_report(compare(load_records([tmp_path]), label_by=("host",))).html
    assert (
        '<a href="#target">Time to a target</a>' in page and '<h2 id="target">Time to a target</h2>' in page
    )
    table = page.split('<h2 id="target">')[1].split("</table>")[0]
    header = re.findall(r"<th>([^<]*)</th>", table)
    assert header[5:13] == [
        "samples/s", "target", "time to target", "epoch", "steps", "samples", "energy to target", "final val loss"
    ]  # fmt: skip
    rows = {
        cells[-1].rsplit("/", 1)[-1]: cells
        for cells in (re.findall(r"<td>([^<]*)</td>", row) for row in table.split("<tr>")[2:])
    }
    assert len(rows) == 4
    (got,) = [
        cells
        for name, cells in rows.items()
        if name not in ("metered.json", "diverged.json") and cells[6] == "3.5"
    ]
    steps = target["steps"]
    assert got[7] == f"{target['time_to_target_s']:.3g} s" and got[8] == str(target["epoch"])
    assert got[9] == f"{steps:,}" and got[10] == f"{target['samples']:,}" and got[11] == "not measured"
    assert float(got[5].replace(",", "")) > 0  # its throughput beside it
    assert rows["metered.json"][11] == "12.5 J"
    assert (
        rows["diverged.json"][7] == "no valid result: diverged" and rows["diverged.json"][8:12] == ["-"] * 4
    )
    (missed,) = [cells for cells in rows.values() if cells[6] == "0.01"]
    assert missed[7].startswith(
        "not reached: --target-loss 0.01 not reached in 2 epoch(s); the best validation"
    )
    assert missed[8:12] == ["-"] * 4


def test_a_report_without_targets_has_no_target_section(results: Path) -> None:
    page = build_report(compare(load_records([results / "real"]), label_by=("host",))).html
    assert 'id="target"' not in page and "Time to a target" not in page


def test_a_workload_with_no_timed_epoch_gets_no_empty_panel(results: Path, tmp_path: Path) -> None:
    """An interrupted run with no steady epoch, the only run of its workload: the comparison says why it has no
    time, and the epoch-time figure draws no empty panel for it."""
    from accelbench.report.entries import entries
    from accelbench.report.figures import epoch_time_figures

    fp32 = next(
        json.loads(p.read_text())
        for p in (results / "real").glob("*.json")
        if json.loads(p.read_text())["config"]["precision"] == "fp32"
    )
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "timed.json").write_text(json.dumps(fp32))
    untimed = derived(fp32, config__batch_size=4, metrics__epochs=[],
                      outcome={"status": "interrupted", "message": "Ctrl-C during epoch 1", "traceback": None})  # fmt: skip
    (folder / "untimed.json").write_text(json.dumps(untimed))
    comparison = compare(load_records([folder]), label_by=("host",))
    assert len(comparison.groups) == 2
    items = entries(comparison)
    figures = epoch_time_figures(items, comparison.systems)
    panels = sum(len(fig.figure.axes) for fig in figures)
    assert panels == 1  # the timed workload's panel alone
