"""Finding and reading result files, fast: a summary per run, bad files named and skipped (fatal with --strict).

Records gathered from many systems are many small JSON files. Each is parsed and checked in one step by
:class:`~accelbench.compare.summary.RecordView` (pydantic's JSON parser, only the fields compare uses become
Python objects), which is several times cheaper than loading and validating a whole record. A file that fails
that check is read again the careful way (:func:`accelbench.results.read_record`), so the reason given for a
malformed, foreign or newer-schema file is worded as everywhere else in accelbench, and a record of an older
schema version is migrated (:func:`accelbench.results.migrate`) before it is summarised.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import ValidationError

from accelbench.comm.options import implausible
from accelbench.comm.records import CommRecord, comm_record_in
from accelbench.compare.summary import Interner, RecordView, RunSummary, summarize
from accelbench.errors import AccelbenchError, ResultFileError
from accelbench.results import POINTS_FOLDER, migrate, read_record, read_record_bytes


@dataclass
class RecordSet:
    """What reading a set of files and folders gave: a summary per run, and the files skipped with the reason."""

    records: list[RunSummary] = field(default_factory=list)
    comm: list[tuple[str, CommRecord]] = field(
        default_factory=list
    )  # (file, record) of `accelbench comm` records
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    duplicates: list[Path] = field(default_factory=list)


def _walk(folder: str) -> Iterator[str]:
    """``*.json`` files under ``folder`` in path order (names compared part by part, as sorting Paths does).

    Temporary files of an atomic write in progress (``.tmp-*``) and a profiled run's trace being written
    (``.trace-*``) are not records yet and are left alone, as is a sweep's folder of point configurations; links to folders are not followed (a loop would never
    end); a link that cannot be resolved (a loop of links) is listed, so that reading it names the problem; pipes
    and devices are left alone (reading one could block or never end). A folder that cannot be listed is an
    :class:`AccelbenchError` naming it.
    """
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise AccelbenchError(f"{folder}: cannot list this folder ({exc.strerror or exc})") from None
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if entry.name != POINTS_FOLDER:  # a sweep's point configurations: not records
                yield from _walk(entry.path)
        elif entry.name.endswith(".json") and not entry.name.startswith(_IN_PROGRESS):
            try:
                regular = entry.is_file()
            except OSError:  # a loop of links: read_view says so, and the file is skipped with that reason
                regular = True
            if regular:
                yield entry.path


_IN_PROGRESS = (".tmp-", ".trace-")  # an atomic write's temporary file; a trace being exported


def result_files(paths: Sequence[Path | str]) -> list[str]:
    """Files named on the command line as given; folders searched recursively for ``*.json``."""
    files: list[str] = []
    for path in paths:
        text = os.fspath(path)
        if os.path.isdir(text):
            files.extend(_walk(text))
        elif os.path.lexists(
            text
        ):  # a file, or something named that is none (a pipe, a loop of links): said why
            files.append(text)
        else:
            raise AccelbenchError(
                f"{path}: no such file or directory; give result files or folders holding them"
            )
    return files


def find_result_files(paths: Sequence[Path]) -> list[Path]:
    """:func:`result_files` as paths."""
    return [Path(p) for p in result_files(paths)]


def read_view(file: str) -> RecordView:
    """The fields compare uses of one result file, validated; :class:`ResultFileError` saying what is wrong."""
    data = read_record_bytes(Path(file))
    try:
        return RecordView.model_validate_json(data)
    except (ValidationError, RecursionError):
        pass
    # not a current-version record with the fields compare uses: find out why, or migrate an older version
    read_record(Path(file))  # raises ResultFileError naming what is wrong
    try:
        return RecordView.model_validate(migrate(json.loads(data)))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise ResultFileError(f"{Path(file)}: invalid result record: {problems}") from exc


# From this many files, the reading and summarising is shared over the host's cores (at most MAX_READERS processes):
# it is most of compare's time (about 0.2 ms a record, so 100,000 records took 20 s on one core of a 2-core VM).
# Below it one process reads them all: forking the readers costs more than it saves.
PARALLEL_FROM = 4096
MAX_READERS = 8


def _readers() -> int:
    """How many processes share the reading: the cores this process may use, where forking is how they start."""
    if "fork" not in multiprocessing.get_all_start_methods():  # forked readers inherit what is imported
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_READERS))


def _summaries_of(files: list[str]) -> list[RunSummary | None]:
    """A reader's share: each file's summary, or None where it is not a current record with the fields compare
    uses (the parent reads those itself, so malformed, older and comm records are handled in one place)."""
    intern = Interner()
    summaries: list[RunSummary | None] = []
    for file in files:
        try:
            summaries.append(summarize(read_view(file), file, intern))
        except ResultFileError:
            summaries.append(None)
    return summaries


def _read_in_parallel(files: list[str], readers: int) -> list[RunSummary | None]:
    """:func:`_summaries_of` over ``files``, in order, shared by ``readers`` forked processes (a few chunks each,
    so a slow chunk does not hold the others up)."""
    size = -(-len(files) // (4 * readers))
    chunks = [files[i : i + size] for i in range(0, len(files), size)]
    with ProcessPoolExecutor(readers, mp_context=multiprocessing.get_context("fork")) as pool:
        return [summary for part in pool.map(_summaries_of, chunks) for summary in part]


def _shared(summary: RunSummary, intern: Interner) -> RunSummary:
    """A summary from a reader process with its common values replaced by this process's one copy of each."""
    return replace(
        summary,
        model_name=intern(summary.model_name),
        key=intern(summary.key),
        system=intern(summary.system),
        environment=intern(summary.environment),
        node_facts=intern(summary.node_facts),
    )


def load_records(paths: Sequence[Path | str], strict: bool = False) -> RecordSet:
    """Read every result file under ``paths`` into a :class:`RecordSet` of run summaries.

    A malformed, foreign or newer-schema file is skipped and reported by name (with ``strict``, the first one in
    path order raises :class:`ResultFileError`). The same run found twice (a record copied into two folders)
    counts once.
    """
    result = RecordSet()
    seen: set[str] = set()
    intern = Interner()
    files = result_files(paths)
    readers = _readers() if len(files) >= PARALLEL_FROM else 1
    read = _read_in_parallel(files, readers) if readers > 1 else [None] * len(files)
    for file, summary in zip(files, read, strict=True):
        if summary is not None:  # read by a reader process
            if summary.run_id in seen:
                result.duplicates.append(Path(file))
            else:
                seen.add(summary.run_id)
                result.records.append(_shared(summary, intern))
            continue
        try:
            view = read_view(file)
        except ResultFileError as exc:
            reason = exc
            try:  # not a training run's record: perhaps collective bandwidth (`accelbench comm`)
                comm = comm_record_in(Path(file))
            except ResultFileError as comm_exc:
                comm, reason = (
                    None,
                    comm_exc,
                )  # it claims to be a comm record: why it is not one is the reason
            why = implausible(comm) if comm is not None else None
            if why is not None:  # a comm record whose figures no measurement gives
                comm, reason = None, ResultFileError(f"{file}: invalid comm record: {why}")
            if comm is not None:
                if comm.run_id in seen:
                    result.duplicates.append(Path(file))
                else:
                    seen.add(comm.run_id)
                    result.comm.append((file, comm))
                continue
            if strict:
                raise reason from None
            path = Path(file)
            result.skipped.append((path, str(reason).removeprefix(f"{path}: ")))
            continue
        if view.run_id in seen:
            result.duplicates.append(Path(file))
            continue
        seen.add(view.run_id)
        result.records.append(summarize(view, file, intern))
    return result
