"""Energy from the CPU's RAPL counters (against a faithful sysfs tree), and torch's build read without importing it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from accelbench.backends.cpu import CpuBackend, rapl_packages


def rapl_zone(root: Path, name: str, energy_uj: int, max_uj: int = 262_143_328_850) -> Path:
    """A powercap zone as the intel_rapl driver shows it: a cumulative counter and the value it wraps at."""
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (zone / "name").write_text("package-0\n" if name.count(":") == 1 else "core\n")
    return zone / "energy_uj"


def test_cpu_energy_is_the_packages_rapl_counters_over_the_epoch(tmp_path: Path) -> None:
    first = rapl_zone(tmp_path, "intel-rapl:0", 1_000_000)
    second = rapl_zone(tmp_path, "intel-rapl:1", 262_143_000_000)  # about to wrap
    rapl_zone(
        tmp_path, "intel-rapl:0:0", 5
    )  # a sub-domain (the cores) is inside package 0: not counted again
    assert [p.name for p in rapl_packages(tmp_path)] == ["intel-rapl:0", "intel-rapl:1"]
    backend = CpuBackend(powercap=tmp_path)
    cpu = torch.device("cpu")
    backend.epoch_start(cpu)
    first.write_text("31000000\n")  # +30 J
    second.write_text("171150\n")  # wrapped: +(262_143_328_850 - 262_143_000_000 + 171_150) uJ = +0.5 J
    energy = backend.epoch_end(cpu).energy
    assert energy is not None and abs(energy.joules - 30.5) < 1e-9
    assert energy.domain.startswith("rapl:") and energy.domain.endswith("intel-rapl:0+intel-rapl:1")
    assert "RAPL" in energy.source


def test_cpu_energy_is_unknown_where_rapl_is_not_readable(tmp_path: Path) -> None:
    backend = CpuBackend(powercap=tmp_path / "absent")
    cpu = torch.device("cpu")
    backend.epoch_start(cpu)
    assert backend.epoch_end(cpu).energy is None  # never a made-up figure
    assert backend.detect_devices()[0].details["energy_counter"] == "none readable"


FAKE_TORCH_VERSION = """
__version__ = '2.11.0+cu130'
git_version = 'deadbeef'
cuda: Optional[str] = '13.0'
hip: Optional[str] = None
"""


def test_torch_build_is_read_without_importing_torch(tmp_path: Path) -> None:
    """Detection asks whether torch is a CUDA or ROCm build; reading torch/version.py answers that without the
    seconds `import torch` costs, so `accelbench plugins` stays fast."""
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('importing torch is what this must not do')\n")
    (package / "version.py").write_text(FAKE_TORCH_VERSION)
    script = (
        "import json, sys; from accelbench.devices import torch_build; b = torch_build(); "
        "print(json.dumps([b.version, b.cuda, b.hip, 'torch' in sys.modules]))"
    )
    env_path = f"{tmp_path}:{':'.join(p for p in sys.path if p)}"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={"PYTHONPATH": env_path}
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["2.11.0+cu130", "13.0", None, False]
