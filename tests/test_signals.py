"""SIGTERM before training ends the process at once (exit 130, no traceback), wherever it lands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

INSTALLED = "from accelbench.engine.signals import TERMINATION; TERMINATION.install(); "


def python(code: str, folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", INSTALLED + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_sigterm_during_an_import_that_catches_it_ends_at_once_without_a_traceback(tmp_path: Path) -> None:
    """Slurm's --kill-on-bad-exit reached a rank while torch imported numpy: the exit raised there was caught, numpy
    imported again ("cannot load module more than once per process") and the rank printed a traceback."""
    (tmp_path / "half_loaded.py").write_text(
        "import os, signal, time\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "except BaseException:  # as an extension's loader may; a second load then fails\n"
        "    raise ImportError('cannot load module more than once per process')\n"
    )
    proc = python("import half_loaded", tmp_path)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr


def test_sigterm_before_training_outside_an_import_exits_130(tmp_path: Path) -> None:
    proc = python(
        "import os, signal, time\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)\n"
        "finally:\n"
        "    print('unwound')\n",  # outside an import the exit unwinds as before: finally blocks run
        tmp_path,
    )
    assert proc.returncode == 130 and "unwound" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
