"""What makes `estimate` of a large model fast and dependency-light: a deep model's step read off its traces at 1, 2
and 3 layers (exactly the operators a whole trace records), a build for shapes alone that draws no initial values,
and a llama estimate that needs no tokenizer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelbench.config import RunConfig
from accelbench.estimate import operators
from accelbench.plugins import get_host
from accelbench.workloads import building_shapes_only, shapes_only


@pytest.mark.parametrize(
    ("workload", "model", "precision", "kernels"),
    [
        ("gpt", "gpt2", "fp32", "foreach"),
        ("gpt", "gpt2", "bf16-mixed", "fused"),
        ("llama", "llama-small", "fp32", "plain"),
    ],
)
def test_a_deep_models_step_read_off_three_shallow_traces_is_its_whole_trace(
    workload: str, model: str, precision: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpt2's 12 layers and llama-small's 8, traced whole and read off their 1-, 2- and 3-layer traces: the same
    operators, in the same order, of the same sizes (the foreach lists and the clipping's stack growing a layer at a
    time, a layer's forward and backward and a plain optimizer's per-tensor updates inserted)."""
    host = get_host()
    config = host.resolve(RunConfig(workload=workload, model=model, batch_size=2, precision=precision))
    plan = host.select_backend("cpu").precision_plan(
        config.precision, torch.device("cpu"), config.backend_options
    )
    job = host.workload(workload)
    operators._TRACED.clear()
    monkeypatch.setattr(operators, "DEEP", 6)
    deep = operators.step_operators(job, config, plan, "cpu", kernels)
    operators._TRACED.clear()
    monkeypatch.setattr(operators, "DEEP", 10**6)  # no model is deep: traced whole
    whole = operators.step_operators(job, config, plan, "cpu", kernels)
    assert deep.operators == whole.operators and deep.parameter_tensors == whole.parameter_tensors
    assert len(whole.operators) > 1000


def test_a_rule_that_does_not_hold_for_three_layers_is_not_extrapolated() -> None:
    """Where one layer more changes an operator's kind, nothing is read off: the caller traces the model whole."""
    one = (operators.Operator("mm", "forward", "float32", 8.0, 16.0),)
    two = (*one, operators.Operator("mm", "forward", "float32", 8.0, 16.0))
    assert operators._extended(one, two, 3) == one * 4
    odd = (operators.Operator("add", "forward", "float32", 0.0, 16.0),)
    assert operators._extended(one + one, odd, 1) is None  # fewer operators a layer more
    grown = (operators.Operator("_foreach_add_", "optimizer", "float32", 0.0, 32.0, elements=4),)
    base = (operators.Operator("_foreach_add_", "optimizer", "float32", 0.0, 16.0, elements=4),)
    assert operators._extended(base, grown, 2, by_kind=True) == (
        operators.Operator("_foreach_add_", "optimizer", "float32", 0.0, 48.0, elements=4),
    )


def test_a_build_for_shapes_draws_no_values_and_restores_torchs_initialisers() -> None:
    normal = torch.nn.init.normal_
    tensor = torch.zeros(4)
    with shapes_only():
        assert building_shapes_only()
        assert torch.nn.init.normal_(tensor, 0.0, 1.0) is tensor and not tensor.any()
        torch.nn.init.kaiming_uniform_(tensor.view(2, 2))
        assert not tensor.any()
    assert not building_shapes_only()
    assert torch.nn.init.normal_ is normal
    torch.nn.init.normal_(tensor)
    assert tensor.any()


def test_estimating_a_llama_needs_no_tokenizer(tmp_path: Path) -> None:
    """With the ``tokenizers`` package unimportable, `estimate` of a llama prices it (a build for its shapes makes
    token ids of the right shape, no tokenizer trained or loaded)."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "tokenizers.py").write_text('raise ImportError("tokenizers is not installed (test)")\n')
    done = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "estimate", "--workload", "llama", "--model", "llama3-8b",
         "--device", "H100", "--json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(blocked), "ACCELBENCH_CACHE_DIR": str(tmp_path / "c")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"step_time_s"' in done.stdout and "tokenizers" not in done.stderr
