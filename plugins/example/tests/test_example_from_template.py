"""The proof that the template works: this example plugin is exactly what the template makes, and (in
test_example_contract.py) it passes the conformance kit. A second plugin made now, for a device type torch knows
but this machine lacks, installs, loads and reports "no device" cleanly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1]
TEMPLATE = EXAMPLE.parent / "_template"
# How plugins/example was made (keep in step with the command in plugins/_template/README.md):
EXAMPLE_ARGS = [
    "example",
    "--device-unit",
    "the host CPU, standing in for an accelerator",
    "--priority",
    "-10",
]


def load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("make_plugin", TEMPLATE / "make_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not {"__pycache__", "build", ".pytest_cache", ".ruff_cache"}
        & set(p.relative_to(root).parts)  # what builds and tools leave (git ignores it)
        and ".egg-info" not in str(p)
        and p.name != Path(__file__).name
    }


def test_the_example_is_exactly_what_the_template_makes(tmp_path: Path) -> None:
    generator = load_generator()
    dest = tmp_path / "example"
    generator.main([*EXAMPLE_ARGS, "--dest", str(dest)])
    assert files(dest) == files(EXAMPLE)


def test_the_generator_refuses_bad_names_and_existing_folders(tmp_path: Path) -> None:
    generator = load_generator()
    with pytest.raises(ValueError, match="lowercase Python identifier"):
        generator.make_plugin("Gaudi-2", tmp_path / "x", "cpu", "HPU", 100)
    with pytest.raises(ValueError, match="other than accelbench, cpu, template"):
        generator.make_plugin("cpu", tmp_path / "x", "cpu", "HPU", 100)
    with pytest.raises(ValueError, match="already exists"):
        generator.make_plugin("gaudi", tmp_path, "cpu", "HPU", 100)


def test_a_plugin_for_a_device_this_machine_lacks_loads_and_finds_nothing(tmp_path: Path) -> None:
    generator = load_generator()
    plugin = tmp_path / "gaudi"
    generator.make_plugin("gaudi", plugin, "hpu", "one Gaudi card", 100)
    site = tmp_path / "site"  # installed the way pip would leave it: the package plus its dist-info
    dist = site / "accelbench_gaudi-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: accelbench-gaudi\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[accelbench]\ngaudi = accelbench_gaudi.plugin:GaudiBackend\n")
    (site / "accelbench_gaudi").symlink_to(plugin / "accelbench_gaudi")
    script = (
        "import json; from accelbench.plugins import PluginHost; h = PluginHost(strict=True); b = h.backends['gaudi'];"
        "print(json.dumps([b.info.device_type, b.detect(), b.detect_error, h.select_backend(None).name]))"
    )
    env = {"PYTHONPATH": f"{site}:{':'.join(p for p in sys.path if p)}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == '["hpu", [], null, "cpu"]'
