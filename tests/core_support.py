"""Helpers for the core tests: real installed test distributions, running the CLI as a user does, and copies of
real records changed for what one machine cannot produce.

A module of its own (not conftest.py) so that test modules import it by a name no plugin's tests share.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from accelbench.testing.contract import TINY_ARGS

# A tiny custom model (the conformance kit's): real training, a few seconds on two cores.
TINY = list(TINY_ARGS)


@dataclass
class Site:
    """A directory on PYTHONPATH holding installed distributions (``*.dist-info``), as pip would leave them."""

    path: Path

    def add_distribution(
        self, name: str, entry_points: dict[str, str], modules: dict[str, str], version: str = "0.1.0"
    ) -> None:
        dist_info = self.path / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir(parents=True)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
        (dist_info / "entry_points.txt").write_text(f"[accelbench]\n{lines}\n")
        for module, source in modules.items():
            (self.path / f"{module}.py").write_text(textwrap.dedent(source))

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.path), env.get("PYTHONPATH")]))
        env.pop("ACCELBENCH_STRICT_PLUGINS", None)
        env.update(extra)
        return env


def accelbench_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``accelbench ARGS`` in this process (``accelbench.cli.main``), for refusals that stop before anything is
    built: its exit code (argparse's own included) and what it printed on stderr. Cheaper than a fresh interpreter
    by the imports (torch's, dynamo's) this process already has."""
    from accelbench.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        # as the interpreter maps it: None is 0, a message 1
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return code, capsys.readouterr().err


def accelbench(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the installed `accelbench` command in a fresh interpreter. Past ``timeout`` it is killed and the test
    fails with what it had printed (the tail of its stderr): a hang says where it hung."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "accelbench.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        raise AssertionError(
            f"accelbench {' '.join(args)} ran past {timeout:g} s and was killed; its stderr ended:\n{stderr[-3000:]}"
        ) from None


def run_here(*args: str, env: dict[str, str] | None = None) -> int:
    """``accelbench run ARGS`` in this process, with ``env``'s variables set for it, its exit code; the environment
    and torch's intra-op thread count (which ``--threads`` sets for the process) as they were before. For a run of
    one process whose record is what a test reads: a fresh interpreter costs its imports (torch's, dynamo's: about
    3.5 s); a job of several starts them anyway, through a launcher of its own (:func:`accelbench`)."""
    import torch

    from accelbench.cli import main

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        try:
            return main(["run", *args])
        finally:
            torch.set_num_threads(threads)


def run_ok(*args: str, env: dict[str, str], timeout: float = 300) -> None:
    """``accelbench run ARGS`` (``env``'s variables set for it), which must succeed: a run of one process in this
    process (:func:`run_here`), a job of several (``--devices``) through its launcher in a fresh interpreter, as a
    user starts it (:func:`accelbench`)."""
    if "--devices" not in args:
        assert run_here(*args, env=env) == 0, f"accelbench run {' '.join(args)}"
        return
    proc = accelbench("run", *args, env={**os.environ, **env}, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


class RealRuns:
    """Real short runs of ``accelbench run`` on this CPU, for tests that read their records; each folder of records
    is made once a session, and every test module that asks for the same runs shares it. They run in this process
    (``accelbench.cli.main``, torch's thread count put back after): what these tests read is the record, not how an
    interpreter starts, and a fresh one would cost its imports (torch's, dynamo's: about 3.5 s) per run."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._folders: dict[tuple[str, tuple[tuple[str, ...], ...]], Path] = {}

    def folder(self, *runs: Sequence[str], name: str = "real") -> Path:
        """A folder named ``name`` holding the records of ``accelbench run ARGS -q`` for each ARGS in ``runs``."""
        key = (name, tuple(tuple(args) for args in runs))
        if key not in self._folders:
            folder = self._root / str(len(self._folders)) / name
            for args in runs:
                assert run_here(*args, "--output-dir", str(folder), "-q") == 0, (
                    f"accelbench run {' '.join(args)}"
                )
            self._folders[key] = folder
        return self._folders[key]

    def record(self, *args: str) -> Path:
        """The one record of ``accelbench run ARGS -q``."""
        (path,) = self.folder(args).glob("*.json")
        return path


def derived(record: dict, **changes: object) -> dict:
    """A copy of a real record with some fields changed (dotted paths) and a new run id: for logic a CPU cannot
    produce (several device counts, a GPU's precision plan). Never used as a measurement."""
    copy = json.loads(json.dumps(record))
    copy["run_id"] = uuid.uuid4().hex
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = copy
        for name in parents:
            target = target[name]
        target[last] = value
    return copy


def epoch_on_the_global_batch(job: Any, model: Any, optimizer: Any, epoch: int, replicas: int) -> float:
    """One epoch of one device training ``model`` on each step's ``replicas`` shares together (the global batch a
    data- or expert-parallel job splits), clipped to 1.0 as the reference executor clips: the mean of its steps'
    losses. What a multi-process run's losses are compared against."""
    import torch

    steps = []
    for parts in zip(*(job.data.batches(epoch, r, replicas) for r in range(replicas)), strict=True):
        loss = model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps.append(loss.item())
    return sum(steps) / len(steps)


def load_script(path: Path) -> ModuleType:
    """A script of benchmarks/ imported as a module (by its file name), for tests of its parts."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def installed_plugin(folder: Path, name: str, plugin: str, init: str = "") -> dict[str, str]:
    """A plugin ``accelbench-NAME`` (package ``accelbench_NAME`` with ``plugin`` as its ``plugin.py``) installed as
    pip would leave it in ``folder/site`` (the package and its dist-info with the ``accelbench`` entry point); returns
    the environment a subprocess sees it in (``folder`` as its home)."""
    site = folder / "site"
    package = site / f"accelbench_{name}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    (package / "plugin.py").write_text(plugin)
    dist = site / f"accelbench_{name}-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: accelbench-{name}\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[accelbench]\n{name} = accelbench_{name}.plugin\n")
    return {
        "PYTHONPATH": f"{site}:{':'.join(p for p in sys.path if p)}",
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
    }
