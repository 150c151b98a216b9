"""Bad input gets a clear, actionable error before anything runs, and no result file."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelbench.cli import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--precision", "fp8"],
            "--precision: unknown precision 'fp8'; choose one of: fp32, fp16-mixed, bf16-mixed",
        ),
        (["--model", "gpt5"], "unknown model 'gpt5' for workload 'gpt'; choose one of: gpt-nano"),
        (["--model", "custom", "--layers", "2"], "model 'custom' needs all of --layers, --heads and --embd"),
        (["--layers", "2"], "use them with --model custom"),
        (["--model", "custom", "--layers", "2", "--heads", "3", "--embd", "16"], "not divisible by heads 3"),
        (["--batch-size", "0"], "--batch-size: Input should be greater than 0"),
        (["--epochs", "-1"], "--epochs: '-1' is neither a number of epochs (1 or more, e.g. 5) nor auto"),
        (["--epochs", "many"], "--epochs: 'many' is neither a number of epochs"),
        (["--rdzv-endpoint", "node01:70000"], "is not HOST:PORT with a port from 1 to 65535"),
        (["--rdzv-endpoint", "node01"], "'node01' is not HOST:PORT"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "node01:29500"],
            "--node-rank 2 with --nnodes 2: node ranks count from 0, so the last node is 1",
        ),
        (["--precision", "bf16"], "unknown precision 'bf16'; did you mean bf16-mixed?"),
        (["--dropout", "1.5"], "--dropout: Input should be less than 1"),
        (["--backend", "npu"], "unknown backend 'npu'; installed backends: "),
        (
            ["--workload", "resnet"],
            "unknown workload 'resnet'; available: bert, efficientnet-b0, gpt, llama, mobilenet-v3-large",
        ),
        (["--data", "/nonexistent/shakespeare.txt"], "--data /nonexistent/shakespeare.txt: no such file"),
        (
            ["--strategy", "tensor-parallel"],
            "backend 'cpu' does not support strategy 'tensor-parallel'; it supports:",
        ),
        (["--block-size", "4096", "--data", "SMALL"], "shorter than block size + 1"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(args, message, tmp_path: Path, capsys) -> None:
    small = tmp_path / "small.txt"
    small.write_text("tiny corpus")
    args = [str(small) if a == "SMALL" else a for a in args]
    out = tmp_path / "results"
    code = main(["run", *args, "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert message in " ".join(err.split()), err
    assert "Traceback" not in err
    if "--backend" in args:  # the installed backends are listed, the built-in one always among them
        assert "cpu" in err.split("installed backends:")[1]
    assert not out.exists() or not list(out.iterdir())


def test_unknown_subcommand_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["benchmark-everything"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_info_reports_the_cpu_device_and_versions(capsys) -> None:
    import json

    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cpu = next(b for b in data["backends"] if b["backend"]["name"] == "cpu")
    assert cpu["devices"][0]["memory_bytes"] > 0
    assert data["system"]["torch_version"] and data["plugins"]["accelbench"]
