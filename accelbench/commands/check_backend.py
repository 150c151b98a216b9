"""``accelbench check-backend NAME``: the conformance kit run against an installed backend plugin, no test file to
write, and a report of what passed, what failed (with why) and what this machine could not prove (with why).

The kit (:class:`accelbench.testing.BackendContract`) runs under pytest, in a process of its own, from a throwaway
directory: a one-class test module naming the backend, pytest's own configuration empty (the repository's, if the
command runs inside one, is not read). The fast tier by default (what needs no long training run); ``--all-tiers``
adds the short, accumulated, compiled and two-process training runs. Exit 0 when nothing failed (what was not
proven is listed, never counted as passed), 1 when something failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.errors import ConfigError
from accelbench.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

MODULE = '''"""The conformance kit against backend {name!r} (written by accelbench check-backend)."""
from accelbench.testing import BackendContract


class TestConformance(BackendContract):
    backend = {name!r}
'''
INI = "[pytest]\nmarkers =\n    slow: a long test\n    extended: a longer test\n"
NOT_PROVEN = "NOT PROVEN"


def add_check_backend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "backend", metavar="NAME", help="the installed backend to check (see `accelbench plugins`)"
    )
    parser.add_argument("--all-tiers", action="store_true",
                        help="also the training runs through `accelbench run` (short, --grad-accum 2, compiled, two "
                             "processes): minutes")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the report here as JSON too")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                        help="give up after this many seconds (default: 3600)")  # fmt: skip


def check_backend_command(args: argparse.Namespace, err: Console) -> int:
    from rich.console import Console
    from rich.table import Table

    from accelbench.plugins import get_host

    if importlib.util.find_spec("pytest") is None:
        raise ConfigError("the conformance kit runs under pytest, which is not installed: pip install pytest")
    host = get_host()
    if args.backend not in host.backends:
        failed = "; ".join(f"{r.name}: {r.error}" for r in host.failed)
        raise ConfigError(
            f"no installed backend {args.backend!r}; installed: {', '.join(host.backends)}"
            + (f" (plugins that failed to load: {failed})" if failed else "")
        )
    with tempfile.TemporaryDirectory(prefix="accelbench-kit-") as tmp:
        folder = Path(tmp)
        module = folder / f"test_{_identifier(args.backend)}_conformance.py"
        module.write_text(MODULE.format(name=args.backend))
        (folder / "pytest.ini").write_text(INI)
        junit = folder / "report.xml"
        command = [sys.executable, "-m", "pytest", str(module), "-q", "-p", "no:cacheprovider", "-c",
                   str(folder / "pytest.ini"), "--rootdir", str(folder), f"--junitxml={junit}", "-rN"]  # fmt: skip
        if not args.all_tiers:
            command += ["-m", "not slow"]
        try:
            done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"the kit ran past --timeout {args.timeout:g} s; nothing is reported") from None
        if not junit.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise ConfigError(f"the kit did not run (pytest exit {done.returncode}): {' | '.join(tail)}")
        results = _results(junit)
    console = Console()
    table = Table(title=f"conformance of backend {args.backend!r}" + (" (all tiers)" if args.all_tiers else
                                                                     " (fast tier; --all-tiers adds the runs)"))  # fmt: skip
    table.add_column("check", overflow="fold")
    table.add_column("result")
    table.add_column("why", overflow="fold")
    style = {"passed": "green", "failed": "bold red", "not proven": "yellow", "skipped": "dim"}
    for row in results:
        table.add_row(row["test"], f"[{style[row['result']]}]{row['result']}[/]", row["why"])
    console.print(table)
    counts = {kind: sum(1 for r in results if r["result"] == kind) for kind in style}
    console.print(", ".join(f"{n} {kind}" for kind, n in counts.items() if n))
    if args.json is not None:
        args.json.write_text(json.dumps({"backend": args.backend, "all_tiers": args.all_tiers, "results": results},
                                        indent=2) + "\n")  # fmt: skip
    return ExitCode.OK if counts["failed"] == 0 else ExitCode.ERROR


def _results(junit: Path) -> list[dict[str, str]]:
    """Each test of the kit's run: passed, failed (the first line of why), not proven or skipped (the reason)."""
    rows = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "?").removeprefix("test_").replace("_", " ")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            message = (failure.get("message") or failure.text or "").strip().splitlines()
            rows.append({"test": name, "result": "failed", "why": (message[0] if message else "")[:400]})
        elif skipped is not None:
            reason = (skipped.get("message") or "").removeprefix("Skipped: ")
            kind = "not proven" if reason.startswith(NOT_PROVEN) else "skipped"
            rows.append({"test": name, "result": kind, "why": reason[:400]})
        else:
            rows.append({"test": name, "result": "passed", "why": ""})
    return rows


def _identifier(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)
