"""The proof that the template works and proves something: this example plugin is the template's output with its
TODOs done (every other file is exactly what the template makes), and (in test_example_contract.py) it passes the
conformance kit, while the template's untouched output fails the kit, naming its TODOs. A plugin made now for a
device type this machine lacks installs and loads, and reports its unwritten detection instead of "no device"."""

from __future__ import annotations

import ast
import importlib.util
import json
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


def test_the_example_is_the_template_with_its_todos_done(tmp_path: Path) -> None:
    generator = load_generator()
    dest = tmp_path / "example"
    generator.main([*EXAMPLE_ARGS, "--dest", str(dest)])
    made, example = files(dest), files(EXAMPLE)
    assert set(made) == set(example)
    plugin = "accelbench_example/plugin.py"
    differ = sorted(name for name in made if made[name] != example[name])
    assert set(differ) <= {plugin, "README.md"}, differ  # only the backend's code (and its README's intro)
    assert 'raise NotImplementedError("TODO: ' in made[plugin]
    assert "TODO:" not in example[plugin] and "NotImplementedError" not in example[plugin]


def test_the_example_writes_every_method_the_template_leaves_to_write(tmp_path: Path) -> None:
    """Each method the template leaves to write raises NotImplementedError("TODO: ...") on one line (where the
    kit's TODO check sees it); the example overrides every one of them and raises in none."""
    generator = load_generator()
    dest = tmp_path / "example"
    generator.main([*EXAMPLE_ARGS, "--dest", str(dest)])
    made = (dest / "accelbench_example" / "plugin.py").read_text()
    to_write = {name for name, raises in _methods(made).items() if raises}
    assert {"detect_devices", "epoch_end", "peak_figures"} <= to_write, to_write
    flagged = [line for line in made.splitlines() if "TODO" in line and "NotImplementedError" in line]
    assert len(flagged) == len(to_write), flagged  # one line per method, each one the kit lists
    written = _methods((EXAMPLE / "accelbench_example" / "plugin.py").read_text())
    assert to_write <= set(written), to_write - set(written)
    assert not any(written.values()), written


def _methods(source: str) -> dict[str, bool]:
    """The methods of the module's Backend subclass, each with whether it raises NotImplementedError."""
    tree = ast.parse(source)
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Backend"))
    return {
        node.name: any(
            isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(node)
        )
        for node in cls.body
        if isinstance(node, ast.FunctionDef)
    }


def test_the_untouched_template_fails_the_conformance_kit(tmp_path: Path) -> None:
    """Generated and installed as it comes, the plugin's own test run (the kit) fails, and says why: its TODOs."""
    generator = load_generator()
    plugin = tmp_path / "fresh"
    generator.make_plugin("fresh", plugin, "cpu", "a device not written yet", -20)
    site = _install(tmp_path / "site", "fresh", plugin)
    env = {"PYTHONPATH": f"{site}:{':'.join(p for p in sys.path if p)}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(plugin / "tests")],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:]
    out = proc.stdout
    assert (
        "test_no_template_todo_is_left FAILED" in out
        or "FAILED" in out
        and "test_no_template_todo_is_left" in out
    )
    assert "the template's TODOs are not done" in out
    assert "detection raised: NotImplementedError: TODO" in out


def _install(site: Path, name: str, plugin: Path) -> Path:
    """``plugin`` installed the way pip would leave it: the package plus its dist-info, entry point as generated."""
    dist = site / f"accelbench_{name}-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: accelbench-{name}\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[accelbench]\n{name} = accelbench_{name}.plugin\n")
    (site / f"accelbench_{name}").symlink_to(plugin / f"accelbench_{name}")
    return site


def test_the_generator_refuses_bad_names_and_existing_folders(tmp_path: Path) -> None:
    generator = load_generator()
    with pytest.raises(ValueError, match="lowercase Python identifier"):
        generator.make_plugin("Gaudi-2", tmp_path / "x", "cpu", "HPU", 100)
    with pytest.raises(ValueError, match="other than accelbench, cpu, template"):
        generator.make_plugin("cpu", tmp_path / "x", "cpu", "HPU", 100)
    with pytest.raises(ValueError, match="already exists"):
        generator.make_plugin("gaudi", tmp_path, "cpu", "HPU", 100)


def test_a_plugin_for_a_device_this_machine_lacks_loads_and_reports_its_unwritten_detection(
    tmp_path: Path,
) -> None:
    generator = load_generator()
    plugin = tmp_path / "gaudi"
    generator.make_plugin("gaudi", plugin, "hpu", "one Gaudi card", 100)
    site = _install(tmp_path / "site", "gaudi", plugin)
    script = (
        "import json; from accelbench.plugins import PluginHost; h = PluginHost(strict=False); b = h.backends['gaudi'];"
        "r = next(r for r in h.records if r.name == 'gaudi');"
        "print(json.dumps([r.status, r.contract, b.info.device_type, b.detect(), b.detect_error, h.select_backend(None).name]))"
    )
    env = {"PYTHONPATH": f"{site}:{':'.join(p for p in sys.path if p)}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    status, contract, device_type, devices, error, selected = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (status, contract, device_type, devices) == ("active", "3.3", "hpu", [])
    assert error.startswith("NotImplementedError: TODO: write detect_devices")
    assert selected != "gaudi"  # a backend whose detection is not written never wins selection
    listed = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "plugins"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "backend gaudi: detection failed: NotImplementedError: TODO: write detect_devices" in listed.stdout
