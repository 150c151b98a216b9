"""The core's layers point one way: a module imports only from its own layer or the layers below it.

From the bottom: errors and exit codes; the plugin contract (the Backend base class, every type a plugin sees); the
records' building blocks (devices, config, host facts); the system and result records; workloads and the
executors; the plugin host; the built-in backends; the
run itself (runner, ranks, signals, launcher); what reads records (display, compare, report, sweep); the command
line and the conformance kit. So the result schema never imports a backend, the plugin host never imports the run
engine, and nothing below the command line reaches up into it. Imports under ``if TYPE_CHECKING:`` (annotations
only) do not count; lazy imports inside functions do.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "accelbench"

LAYERS: list[tuple[str, ...]] = [
    ("accelbench", "accelbench.errors", "accelbench.exitcodes"),
    ("accelbench.contract",),
    ("accelbench.devices", "accelbench.parallel_dims", "accelbench.config", "accelbench.hostinfo",
     "accelbench.ipmi"),
    ("accelbench.system", "accelbench.results", "accelbench.comm.collectives", "accelbench.comm.records",
     "accelbench.references",
     "accelbench.plan.schema"),  # a plan file's schema: data, as a record's, which the report reads
    ("accelbench.workloads", "accelbench.engine.executor", "accelbench.engine.distributed",
     "accelbench.engine.parallel", "accelbench.engine.deepspeed", "accelbench.engine.lightning",
     "accelbench.engine.metrics", "accelbench.engine.stragglers", "accelbench.engine.tensor_peak",
     "accelbench.engine.float8", "accelbench.engine.checkpointing", "accelbench.estimate"),
    ("accelbench.plugins",),
    ("accelbench.backends",),
    ("accelbench.engine.runner", "accelbench.engine.ranks", "accelbench.engine.signals", "accelbench.launch",
     "accelbench.launcher",
     "accelbench.engine", "accelbench.comm"),
    ("accelbench.display", "accelbench.compare", "accelbench.report", "accelbench.sweep",
     "accelbench.estimate.command", "accelbench.references.__main__"),
    ("accelbench.cli", "accelbench.commands", "accelbench.testing", "accelbench.__main__", "accelbench.plan"),
]  # fmt: skip


def layer_of(module: str) -> int:
    """The layer of ``module``: the longest layer entry that is the module or a package containing it."""
    best, found = -1, None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), index
    assert found is not None, f"{module} is in no layer: add it to LAYERS"
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every accelbench import in ``path`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    out = []
    package = module_name(path)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "accelbench"]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:  # relative: resolve against this package
                base = package.split(".")[
                    : len(package.split(".")) - node.level + (path.name == "__init__.py")
                ]
                name = ".".join([*base, node.module])
            else:
                name = node.module
            if name.split(".")[0] == "accelbench":
                # `from accelbench.x import y` may import the submodule accelbench.x.y
                out += [(node.lineno, f"{name}.{a.name}") if _is_module(f"{name}.{a.name}") else (node.lineno, name)
                        for a in node.names]  # fmt: skip
    return out


def _is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return (ROOT / relative).with_suffix(".py").exists() or (ROOT / relative / "__init__.py").exists()


SOURCES = sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_no_module_imports_from_a_layer_above_its_own(path: Path) -> None:
    mine = module_name(path)
    upward = [
        f"line {line}: {name} (layer {layer_of(name)})"
        for line, name in imports(path)
        if layer_of(name) > layer_of(mine)
    ]
    assert not upward, f"{mine} (layer {layer_of(mine)}) imports upward: " + "; ".join(upward)
