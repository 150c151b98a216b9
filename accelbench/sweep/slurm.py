"""``sweep --submit slurm``: the points as Slurm job arrays (by default) or one job each, followed until they end.

**Arrays.** The points due in a round that ask for the same resources go as one ``sbatch --array=0-N[%M]``: the
array's points file (``.accelbench-slurm/<array>.points``, beside its script) holds one line per task, and task
``SLURM_ARRAY_TASK_ID`` runs the point on its line. A 200-point grid of two layouts is two jobs, not 200; ``%M``
(``--max-concurrent``) caps how many of an array's tasks run at once. ``--no-slurm-array`` submits one job per point
instead, for sites that turn arrays off (``MaxArraySize=0``) or account per job name. Either way the queue is
followed per point: an array task is ``JOBID_TASK`` in ``squeue -r`` and ``sacct``.

Resuming works as for a local sweep, with the queue as a second source of truth beside the records:

- a point is *done* when the output folder holds its records (:func:`~accelbench.sweep.resume.point_done`), and is
  never submitted again;
- a point whose job (or array task) is *in the queue* (pending, running, ...) is followed, not submitted again.
  Each point has a key, ``ab-<sweep>-<key>``, hashing its options and the resolved output folder. A job of one
  point is named by it; an array is named by a hash of its points' keys, and its points file says which point each
  task runs. So the queue and the files beside the scripts say which points are queued, no state file can disagree
  with ``squeue``, and a sweep re-run from another shell (or after the first was killed) picks its jobs up;
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
DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize: task ids 0 to 1000
ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


@dataclass(frozen=True)
class QueuedJob:
    """A point's job (or array task, ``JOBID_TASK``) in ``squeue``; ``name`` is the job's name, which with the id
    names its output file."""

    job_id: str
    state: str
    name: str


@dataclass
class Followed:
    """A job this invocation submitted or found queued, followed until it leaves the queue."""

    point: Point
    job_id: str
    name: str
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Due:
    """A point to submit this round: its key (:func:`job_name`) and the runs it still needs."""

    point: Point
    key: str
    runs: int


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
    return sweep_prefix(sweep) + hashlib.sha1(canonical.encode()).hexdigest()[:12]


def sweep_prefix(sweep: Sweep) -> str:
    """What every job name of this sweep starts with."""
    return f"ab-{re.sub(r'[^A-Za-z0-9_.-]', '_', sweep.name)[:60]}-"


def array_name(sweep: Sweep, keys: list[str]) -> str:
    """An array's name: a hash of its points' keys. A resubmission after some tasks failed holds a strict subset
    of the points, so it never takes the name (and points file) of an array still in the queue."""
    return sweep_prefix(sweep) + "array-" + hashlib.sha1("\n".join(sorted(keys)).encode()).hexdigest()[:12]


def array_groups(sweep: Sweep, due: list[Due], max_tasks: int) -> list[list[Due]]:
    """The due points as arrays: those asking for the same resources (the same ``#SBATCH`` lines) together, in
    sweep order, each array at most ``max_tasks`` tasks (the cluster's MaxArraySize)."""
    groups: dict[tuple[str, ...], list[Due]] = {}
    for one in due:
        groups.setdefault(tuple(sweep.slurm.for_point(one.point.values).directives()), []).append(one)
    return [g[i : i + max_tasks] for g in groups.values() for i in range(0, len(g), max_tasks)]


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


class QueueReader:
    """Our points in the queue, read from ``squeue -r`` (every array task on a line of its own, ``JOBID_TASK``):
    a job named by a point's key is that point's; an array task's point is its line of the array's points file
    (read once: an array's file never changes while the array is queued)."""

    def __init__(self, prefix: str, output_dir: Path) -> None:
        self.prefix = prefix
        self.folder = output_dir / JOBS_FOLDER
        self._arrays: dict[str, list[str]] = {}

    def read(self) -> dict[str, QueuedJob]:
        """Point key -> its job (the newest, if several)."""
        user = os.environ.get("USER") or _whoami()
        out = _slurm("squeue", "-h", "-r", "-u", user, "-o", "%i|%j|%T")
        if out.returncode != 0:
            raise AccelbenchError(f"squeue failed ({out.returncode}): {out.stderr.strip()[-500:]}")
        jobs: dict[str, QueuedJob] = {}
        for line in out.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 3 or not parts[1].startswith(self.prefix):
                continue
            job_id, name, state = parts
            task = re.fullmatch(r"\d+_(\d+)", job_id)
            if task is None or not name.startswith(self.prefix + "array-"):
                jobs[name] = QueuedJob(job_id, state, name)
                continue
            keys = self._array_keys(name)
            index = int(task.group(1))
            if index < len(keys):  # else an array of the same sweep name submitted for another output folder
                jobs[keys[index]] = QueuedJob(job_id, state, name)
        return jobs

    def _array_keys(self, name: str) -> list[str]:
        if name not in self._arrays:
            try:
                lines = (self.folder / f"{name}.points").read_text(encoding="utf-8").splitlines()
            except OSError:
                return []  # not this output folder's array; not cached, as it may be one being written now
            self._arrays[name] = [line.split("\t", 1)[0] for line in lines]
        return self._arrays[name]


def max_array_size() -> int:
    """The cluster's MaxArraySize (``scontrol show config``; the tasks an array may have), Slurm's default of 1001
    where it cannot be read; a ConfigError naming ``--no-slurm-array`` where arrays are off (0)."""
    out = _slurm("scontrol", "show", "config")
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", out.stdout, re.MULTILINE) if out.returncode == 0 else None
    size = int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE
    if size < 1:
        raise ConfigError(
            "--submit slurm: this cluster turns job arrays off (MaxArraySize = 0); add --no-slurm-array to "
            "submit one job per point"
        )
    return size


def _whoami() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def final_state(job_id: str) -> str:
    """How a job (or array task, ``JOBID_TASK``) that left the queue ended: sacct's state where accounting is
    kept, else scontrol's (which remembers a job for MinJobAge, 300 s by default), else ``ENDED``. An array task
    cancelled while pending never becomes a job of its own, so scontrol does not know it while it still knows its
    array: that is read as ``CANCELLED`` (the sweep reads the queue every few seconds, long before MinJobAge would
    have let a task that ran be forgotten)."""
    if shutil.which("sacct"):
        out = _slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State")
        states = out.stdout.split() if out.returncode == 0 else []
        if states:
            return states[0]
    shown = _slurm("scontrol", "-o", "show", "job", job_id).stdout
    match = re.search(r"JobState=(\S+)", shown)
    if match:
        return match.group(1)
    task = re.fullmatch(r"(\d+)_\d+", job_id)
    if task and "JobState=" in _slurm("scontrol", "-o", "show", "job", task.group(1)).stdout:
        return "CANCELLED"
    return "ENDED"


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


def points_file(sweep: Sweep, group: list[Due], output_dir: Path) -> str:
    """An array's points file: task ``i`` is line ``i + 1``, ``KEY<TAB>RUNS<TAB>CONFIG<TAB>LABEL`` (the point's
    key, the runs it still needs, its configuration, and its label for the job's output)."""
    lines = []
    for one in group:
        config = str(sweep.write_point(one.point, output_dir).resolve())
        if "\t" in config or "\n" in config:
            raise ConfigError(
                f"--output-dir {output_dir}: a tab or line break in the folder's path cannot go in a job array's "
                "points file; use a folder without them, or --no-slurm-array"
            )
        label = " ".join(one.point.label().split())
        lines.append(f"{one.key}\t{one.runs}\t{config}\t{label}\n")
    return "".join(lines)


def array_script(
    sweep: Sweep, group: list[Due], output_dir: Path, name: str, max_concurrent: int | None = None
) -> str:
    """The array job: the group's resources (the same for each of its points) as ``#SBATCH`` lines, one task per
    line of its points file, and each task ``srun`` once per run its point still needs (the first that fails ends
    the task, as a local sweep stops a point's repeats at the first that is not ``ok``)."""
    resources = sweep.slurm.for_point(group[0].point.values)
    folder = (output_dir / JOBS_FOLDER).resolve()
    points = shlex.quote(str(folder / f"{name}.points"))
    throttle = f"%{max_concurrent}" if max_concurrent is not None else ""
    command = shlex.join(child_command([], sweep.memory_cap))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --output={folder / name}-%A_%a.out",
        f"#SBATCH --array=0-{len(group) - 1}{throttle}",
        *(f"#SBATCH {d}" for d in resources.directives()),
        f"# accelbench sweep {sweep.name}: {len(group)} points, task i runs line i + 1 of {name}.points",
        f"IFS=$'\\t' read -r key runs config label < <(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" {points})",
        'if [ -z "$config" ]; then',
        f'  echo "accelbench: no point for array task $SLURM_ARRAY_TASK_ID in "{points} >&2',
        "  exit 2",
        "fi",
        'echo "accelbench sweep: array task $SLURM_ARRAY_TASK_ID runs $label ($runs run(s), $config)"',
        'for run in $(seq "$runs"); do',
        f'  srun --kill-on-bad-exit=1 {command} run --config "$config" --quiet || exit $?',
        "done",
        "",
    ]
    return "\n".join(lines)


def _sbatch(script: Path, what: str) -> str:
    out = _slurm("sbatch", "--parsable", str(script))
    if out.returncode != 0:
        raise AccelbenchError(
            f"sbatch refused {what} ({script}): {out.stderr.strip()[-500:]}; fix the resources (--nodes, "
            "--ntasks-per-node, --gpus-per-node, --time, --partition, --account or the [slurm] table)"
        )
    return out.stdout.strip().split(";")[0]


def submit(sweep: Sweep, point: Point, output_dir: Path, name: str, runs: int) -> str:
    """Write the point's batch script and ``sbatch`` it from the current folder; its job id."""
    folder = output_dir / JOBS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / f"{name}.sbatch"
    script.write_text(batch_script(sweep, point, output_dir, name, runs), encoding="utf-8")
    return _sbatch(script, f"point {point.label()}")


def submit_array(
    sweep: Sweep, group: list[Due], output_dir: Path, name: str, max_concurrent: int | None
) -> str:
    """Write the array's points file and script beside each other and ``sbatch`` it; the array's job id (its
    tasks are ``ID_0`` ... ``ID_N``)."""
    folder = output_dir / JOBS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.points").write_text(points_file(sweep, group, output_dir), encoding="utf-8")
    script = folder / f"{name}.sbatch"
    script.write_text(array_script(sweep, group, output_dir, name, max_concurrent), encoding="utf-8")
    labels = ", ".join(one.point.label() for one in group[:3]) + (", ..." if len(group) > 3 else "")
    return _sbatch(script, f"an array of {len(group)} points ({labels})")


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
    """The last lines of a job's output, ``NAME-JOBID.out`` (an array task's id is ``JOBID_TASK``, as its
    ``%A_%a`` output pattern writes it)."""
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
    array: bool = True,
    max_concurrent: int | None = None,
) -> SweepSummary:
    """Submit every point not done and not queued (``array``: those with the same resources as one job array,
    at most ``max_concurrent`` of its tasks running at once; else one job each), then (``wait``) follow the jobs
    until each has left the queue, saying how each point ended as it does. Returns the summary a local sweep
    returns; a Ctrl-C or SIGTERM stops the following only (the jobs go on; re-running the sweep picks them up)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    records = FolderRecords(output_dir)
    recorded = records.refresh()
    names = {point: job_name(sweep, point, output_dir) for point in sweep.points}
    reader = QueueReader(sweep_prefix(sweep), output_dir)
    array_size: int | None = None  # MaxArraySize, read before the first array is submitted
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
        queue = reader.read()
        while True:
            pending_series: set[tuple[object, ...]] = set()
            due: list[Due] = []
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
                        followed[point] = Followed(point, found.job_id, found.name)
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
                        + f"; {_job_output_tail(output_dir, job.name, job.job_id)}"
                    )
                    log_job(output_dir, sweep, point, state.lower(), job.job_id, message)
                    summary.failed.append((point, Attempt(state.lower(), 1, seconds, None, message)))
                    if state.startswith("OUT_OF_ME"):  # larger sizes of a search would not fit either
                        fit.did_not_fit(point)
                    settle(point, f"{state.lower()}: {message}", "red", seconds)
                elif point.series is not None and point.series in pending_series:
                    continue  # a smaller size of its search is still queued: it may not fit
                else:
                    due.append(Due(point, name, sweep.repeats - outcomes.count("ok")))
                    if point.series is not None:
                        pending_series.add(point.series)
            if due and array and array_size is None:
                array_size = max_array_size()
            groups = array_groups(sweep, due, array_size) if array and array_size else [[d] for d in due]
            for group in groups:
                if array:
                    submitted_as = array_name(sweep, [one.key for one in group])
                    array_id = submit_array(sweep, group, output_dir, submitted_as, max_concurrent)
                    jobs = [f"{array_id}_{i}" for i in range(len(group))]
                    throttle = f", at most {max_concurrent} at once" if max_concurrent is not None else ""
                    console.print(
                        Text(f"submitted {len(group)} point(s) as array job {array_id}{throttle}"),
                        soft_wrap=True,
                    )
                else:
                    submitted_as = group[0].key
                    jobs = [submit(sweep, group[0].point, output_dir, submitted_as, group[0].runs)]
                for one, job_id in zip(group, jobs, strict=True):
                    followed[one.point] = Followed(one.point, job_id, submitted_as)
                    queue[one.key] = QueuedJob(job_id, "PENDING", submitted_as)
                    log_job(output_dir, sweep, one.point, "submitted", job_id, f"{one.runs} run(s)")
                    again = f", {one.runs} runs" if one.runs > 1 else ""
                    console.print(
                        Text(f"{one.point.label()}: submitted as job {job_id}{again}"), soft_wrap=True
                    )
            if len(settled) == len(sweep.points) or not wait:
                break
            sleep(poll_s)
            queue = reader.read()
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
