"""``sweep --submit slurm``: every point a Slurm job (one ``sbatch`` each), followed until they have all ended.

Resuming works as for a local sweep, with the queue as a second source of truth beside the records:

- a point is *done* when the output folder holds its records (:func:`~accelbench.sweep.resume.point_done`), and is
  never submitted again;
- a point whose job is *in the queue* (pending, running, ...) is followed, not submitted again. Jobs are found by
  name, ``ab-<sweep>-<key>``, where the key hashes the point's options and the resolved output folder, so no state
  file can disagree with ``squeue``, and a sweep re-run from another shell (or after the first was killed) picks
  its jobs up;
- any other point is submitted. A job that leaves the queue without its point's record has failed: Slurm's final
  state (``sacct``, else ``scontrol``) and the end of its output file say why; re-running the sweep resubmits it.

In a ``largest_fit`` search, a size is submitted only once the smaller ones have settled, so the first that runs
out of memory still ends the search. Each job runs ``srun --kill-on-bad-exit=1 python -m accelbench.cli run
--config POINT.json`` once per repeat still needed; ``srun`` starts its ranks, which ``run`` adopts. The python is
this one (``sys.executable``): on a cluster the virtual environment must be on a file system the compute nodes see.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.text import Text

from accelbench.config import RunConfig
from accelbench.errors import AccelbenchError, ConfigError
from accelbench.sweep.display import SweepDisplay, outcome_text
from accelbench.sweep.log import SWEEP_LOG
from accelbench.sweep.resume import LargestFit, Recorded, point_done
from accelbench.sweep.runner import SweepSummary
from accelbench.sweep.spec import Point, Sweep
from accelbench.sweep.supervise import Attempt, SweepInterrupted, child_command

JOBS_FOLDER = ".accelbench-slurm"  # each point's batch script and its jobs' output, under the output folder
SLURM_TIMEOUT_S = 60.0  # a Slurm command that has not answered in a minute: the controller is down
ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


@dataclass(frozen=True)
class QueuedJob:
    """A job of ours in ``squeue``."""

    job_id: str
    state: str


@dataclass
class Followed:
    """A job this invocation submitted or found queued, followed until it leaves the queue."""

    point: Point
    job_id: str
    started: float = field(default_factory=time.monotonic)


class FolderRecords:
    """The records of the output folder, re-read as jobs write them: a run writes a draft record (status
    ``error``) before it trains and replaces it at the end, so a file is read again whenever it changes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._read: dict[Path, tuple[int, tuple[RunConfig, str, Path] | None]] = {}

    def refresh(self) -> Recorded:
        recorded = Recorded()
        for path in sorted(self.folder.glob("*.json")):
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:  # replaced or removed between the listing and now
                continue
            cached = self._read.get(path)
            if cached is None or cached[0] != mtime:
                one = Recorded()
                one.add_file(path)
                cached = (mtime, one.entries[0] if one.entries else None)
                self._read[path] = cached
            if cached[1] is not None:
                recorded.entries.append(cached[1])
        return recorded


def job_name(sweep: Sweep, point: Point, output_dir: Path) -> str:
    """The job's name: the sweep and a key of the point's options and output folder (the same in every shell,
    unlike Python's salted ``hash``), so the queue says which points are in it."""
    canonical = json.dumps(
        [[k, str(v)] for k, v in point.options] + [["output_dir", str(output_dir.resolve())]], sort_keys=True
    )
    key = hashlib.sha1(canonical.encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", sweep.name)[:60]
    return f"ab-{stem}-{key}"


def check_slurm() -> None:
    """Refuse ``--submit slurm`` where Slurm's commands are not on PATH, before anything is submitted."""
    missing = [c for c in ("sbatch", "squeue", "scontrol") if shutil.which(c) is None]
    if missing:
        raise ConfigError(
            f"--submit slurm: {', '.join(missing)} not found on PATH; run the sweep on a Slurm login node, or "
            "leave --submit out to run the points here (--submit local)"
        )


def _slurm(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(args), capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise AccelbenchError(
            f"`{' '.join(args)}` did not answer within {SLURM_TIMEOUT_S:.0f} s: is slurmctld up?"
        ) from None


def queued_jobs(prefix: str) -> dict[str, QueuedJob]:
    """Our jobs in the queue whose names start with ``prefix``: name -> job (the newest, if several)."""
    user = os.environ.get("USER") or _whoami()
    out = _slurm("squeue", "-h", "-u", user, "-o", "%i|%j|%T")
    if out.returncode != 0:
        raise AccelbenchError(f"squeue failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    jobs: dict[str, QueuedJob] = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[1].startswith(prefix):
            jobs[parts[1]] = QueuedJob(parts[0], parts[2])
    return jobs


def _whoami() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def final_state(job_id: str) -> str:
    """How a job that left the queue ended: sacct's state where accounting is kept, else scontrol's (which
    remembers a job for MinJobAge, 300 s by default), else ``ENDED``."""
    if shutil.which("sacct"):
        out = _slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State")
        states = out.stdout.split() if out.returncode == 0 else []
        if states:
            return states[0]
    shown = _slurm("scontrol", "-o", "show", "job", job_id).stdout
    match = re.search(r"JobState=(\S+)", shown)
    return match.group(1) if match else "ENDED"


def batch_script(sweep: Sweep, point: Point, output_dir: Path, name: str, runs: int) -> str:
    """The job: its resources as ``#SBATCH`` lines, then one ``srun`` per run still needed (the first that fails
    ends the job, as a local sweep stops a point's repeats at the first that is not ``ok``)."""
    resources = sweep.slurm.for_point(point.values)
    config = sweep.write_point(point, output_dir).resolve()
    command = child_command(["run", "--config", str(config), "--quiet"], sweep.memory_cap)
    log = (output_dir / JOBS_FOLDER).resolve() / f"{name}-%j.out"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --output={log}",
        *(f"#SBATCH {d}" for d in resources.directives()),
        f"# accelbench sweep {sweep.name}: {point.label()}",
        f"for run in $(seq {runs}); do",
        f"  srun --kill-on-bad-exit=1 {shlex.join(command)} || exit $?",
        "done",
        "",
    ]
    return "\n".join(lines)


def submit(sweep: Sweep, point: Point, output_dir: Path, name: str, runs: int) -> str:
    """Write the point's batch script and ``sbatch`` it from the current folder; its job id."""
    folder = output_dir / JOBS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / f"{name}.sbatch"
    script.write_text(batch_script(sweep, point, output_dir, name, runs), encoding="utf-8")
    out = _slurm("sbatch", "--parsable", str(script))
    if out.returncode != 0:
        raise AccelbenchError(
            f"sbatch refused point {point.label()} ({script}): {out.stderr.strip()[-500:]}; fix the resources "
            "(--nodes, --ntasks-per-node, --gpus-per-node, --time, --partition, --account or the [slurm] table)"
        )
    return out.stdout.strip().split(";")[0]


def log_job(output_dir: Path, sweep: Sweep, point: Point, event: str, job_id: str, message: str = "") -> None:
    """One line in the sweep log for a job submitted, found queued, or ended without its record."""
    entry = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sweep": sweep.name,
        "point": {k: str(v) if isinstance(v, Path) else v for k, v in point.options},
        "status": event,
        "slurm_job": job_id,
        "message": message,
    }
    with open(output_dir / SWEEP_LOG, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def _job_output_tail(output_dir: Path, name: str, job_id: str, n: int = 3) -> str:
    path = output_dir / JOBS_FOLDER / f"{name}-{job_id}.out"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"no output at {path}"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return f"{path}: " + (" ".join(lines[-n:])[:600] if lines else "(empty)")


def submit_sweep(
    sweep: Sweep,
    output_dir: Path,
    console: Console,
    wait: bool = True,
    poll_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> SweepSummary:
    """Submit every point not done and not queued, then (``wait``) follow the jobs until each has left the queue,
    saying how each point ended as it does. Returns the summary a local sweep returns; a Ctrl-C or SIGTERM stops
    the following only (the jobs go on; re-running the sweep picks them up)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    records = FolderRecords(output_dir)
    recorded = records.refresh()
    names = {point: job_name(sweep, point, output_dir) for point in sweep.points}
    prefix = f"ab-{re.sub(r'[^A-Za-z0-9_.-]', '_', sweep.name)[:60]}-"
    summary = SweepSummary()
    fit = LargestFit()
    display = SweepDisplay(console, len(sweep.points), live=False)
    settled: set[Point] = set()
    followed: dict[Point, Followed] = {}
    ended: dict[Point, str] = {}  # followed jobs that left the queue: their final state

    def settle(point: Point, text: str, style: str, seconds: float | None = None) -> None:
        settled.add(point)
        display.finish(point, text, style, seconds)

    def on_sigterm(signum: int, frame: object) -> None:
        raise SweepInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        queue = queued_jobs(prefix)
        while True:
            pending_series: set[tuple[object, ...]] = set()
            for point in sweep.points:
                if point in settled:
                    continue
                config = sweep.config(point, output_dir)
                outcomes = recorded.outcomes(config)
                name = names[point]
                job = followed.get(point)
                if fit.beyond(point):
                    summary.beyond_fit += 1
                    settle(point, "not run: a smaller size already did not fit", "dim")
                elif point_done(outcomes, sweep.repeats) and name not in queue:
                    summary.done += 1
                    if "oom" in outcomes:
                        fit.did_not_fit(point)
                    if job is None:
                        summary.skipped_done += 1
                        settle(point, "already recorded: " + outcome_text(outcomes), "dim")
                    else:
                        seconds = time.monotonic() - job.started
                        text = f"{outcome_text(outcomes)} (Slurm job {job.job_id}, {seconds:.0f} s)"
                        settle(point, text, "green" if "ok" in outcomes else "yellow", seconds)
                elif name in queue:
                    if job is None:
                        found = queue[name]
                        followed[point] = Followed(point, found.job_id)
                        log_job(output_dir, sweep, point, "queued", found.job_id, found.state.lower())
                        console.print(
                            Text(
                                f"{point.label()}: already in the queue as job {found.job_id} ({found.state})"
                            ),
                            soft_wrap=True,
                        )
                    if point.series is not None:
                        pending_series.add(point.series)
                elif job is not None:  # it left the queue without the records the point needs
                    state = ended.setdefault(point, final_state(job.job_id))
                    seconds = time.monotonic() - job.started
                    message = (
                        f"Slurm job {job.job_id} ended {state} without its record"
                        + (f" (recorded: {outcome_text(outcomes)})" if outcomes else "")
                        + f"; {_job_output_tail(output_dir, name, job.job_id)}"
                    )
                    log_job(output_dir, sweep, point, state.lower(), job.job_id, message)
                    summary.failed.append((point, Attempt(state.lower(), 1, seconds, None, message)))
                    if state.startswith("OUT_OF_ME"):  # larger sizes of a search would not fit either
                        fit.did_not_fit(point)
                    settle(point, f"{state.lower()}: {message}", "red", seconds)
                elif point.series is not None and point.series in pending_series:
                    continue  # a smaller size of its search is still queued: it may not fit
                else:
                    runs = sweep.repeats - outcomes.count("ok")
                    job_id = submit(sweep, point, output_dir, name, runs)
                    followed[point] = Followed(point, job_id)
                    queue[name] = QueuedJob(job_id, "PENDING")
                    log_job(output_dir, sweep, point, "submitted", job_id, f"{runs} run(s)")
                    again = f", {runs} runs" if runs > 1 else ""
                    console.print(Text(f"{point.label()}: submitted as job {job_id}{again}"), soft_wrap=True)
                    if point.series is not None:
                        pending_series.add(point.series)
            if len(settled) == len(sweep.points) or not wait:
                break
            sleep(poll_s)
            queue = queued_jobs(prefix)
            recorded = records.refresh()
    except (KeyboardInterrupt, SweepInterrupted):
        summary.interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        display.close()
    if not wait or summary.interrupted:
        waiting = [p for p in followed if p not in settled]
        if waiting:
            console.print(
                Text(
                    f"{len(waiting)} job(s) in the queue go on; run the same command again to follow them "
                    "(nothing queued is submitted twice)"
                ),
                soft_wrap=True,
            )
    return summary
