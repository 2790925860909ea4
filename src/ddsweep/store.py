"""The study store: a copy of `results/` outside the machine's working directory, so that a study survives the
loss of its machine (preemption, a node taken back, a time limit).

A store is a shared filesystem path or an S3-compatible bucket (`s3://bucket/prefix`), reached through Snakemake's
storage plugins (snakemake-storage-plugin-fs, snakemake-storage-plugin-s3) with the settings Snakemake reads for them
(for S3: SNAKEMAKE_STORAGE_S3_ENDPOINT_URL, _ACCESS_KEY, _SECRET_KEY, _REGION). Its layout is `results/` as the
workflow writes it, so `ddsweep summarize STORE/results` reads a filesystem store unchanged.

A unit is one job's directory (`results/points/<id>`, `results/launches/<id>/launch-<k>`, `reports`), or one
preset's preflight result (`results/preflight/<preset>.json`, pushed by the preflight job itself before it ends, so
that every point finds its preflight in the store). A finished unit is pushed whole, then its manifest (every file
with its size and mtime; `<unit>/stored.json`, or `<preset>.stored.json` beside a preflight result) last: a unit
without a manifest in the store is never taken for finished. A point job marks each attempt in `<unit>/started/` at
its start and end; an attempt with a start and no end was lost with its machine (docs/results-schema.md,
"Interruptions")."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddsweep.storage import read_json, write_json_atomic

MANIFEST = "stored.json"
# Before each preflight result was a unit of its own, the preflights were one directory unit: a pull still takes a
# preflight result from its manifest.
LEGACY_PREFLIGHTS = "results/preflight"
STARTED = "started"


class StoreError(RuntimeError):
    """The store could not be reached or written: the message names the store and the unit."""


@dataclass(frozen=True)
class StoreLocation:
    """Where a study's store lives: the storage plugin that reaches it and the query prefix of `results/`'s parent."""

    provider: str
    root: str

    def query(self, relative: str) -> str:
        """The storage query of a path relative to the store's root (e.g. `results/points/x/done.json`)."""
        return f"{self.root.rstrip('/')}/{relative}"


def parse_store(url: str) -> StoreLocation:
    """`s3://bucket/prefix` (S3-compatible bucket) or an absolute filesystem path (a shared filesystem)."""
    url = str(url).strip()
    if url.startswith("s3://"):
        if len(url) <= len("s3://") or url[len("s3://"):].startswith("/"):
            raise StoreError(f"store {url!r}: an S3 store is s3://BUCKET/PREFIX")
        return StoreLocation("s3", url.rstrip("/"))
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" in url:
        raise StoreError(f"store {url!r}: only a filesystem path or s3://BUCKET/PREFIX is supported")
    if not os.path.isabs(url):
        raise StoreError(f"store {url!r}: a filesystem store must be an absolute path (it outlives this directory)")
    return StoreLocation("fs", os.path.normpath(url))


def _plugin_settings(module: Any, provider: str) -> Any:
    """The plugin's settings from the environment variables Snakemake reads for it (SNAKEMAKE_STORAGE_<P>_<KEY>)."""
    settings_cls = getattr(module, "StorageProviderSettings", None)
    if settings_cls is None:
        return None
    values = {}
    for spec in fields(settings_cls):
        value = os.environ.get(f"SNAKEMAKE_STORAGE_{provider}_{spec.name}".upper())
        if value is not None:
            values[spec.name] = int(value) if spec.type in (int, "int") else value
    return settings_cls(**values)


class StudyStore:
    """A study's store, read and written through the storage plugin of its location."""

    def __init__(self, location: StoreLocation, local_prefix: Path | None = None) -> None:
        self.location = location
        module_name = f"snakemake_storage_plugin_{location.provider}"
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise StoreError(f"store {location.root}: the storage plugin {module_name.replace('_', '-')} is not "
                             "installed (pip install 'ddsweep[store]')") from exc
        # Where the plugin stages copies. One made here goes with the store (at the latest when the process exits):
        # every point job opens a store, and a node's temporary directory would otherwise keep one per job.
        self.scratch = local_prefix or Path(tempfile.mkdtemp(prefix="ddsweep-store-"))
        if local_prefix is None:
            weakref.finalize(self, shutil.rmtree, self.scratch, True)
        self.provider = module.StorageProvider(local_prefix=self.scratch, logger=logging.getLogger("ddsweep.store"),
                                               settings=_plugin_settings(module, location.provider))

    @classmethod
    def open(cls, url: str) -> StudyStore:
        """The store at `url` (see parse_store)."""
        return cls(parse_store(url))

    def _object(self, relative: str) -> Any:
        return self.provider.object(self.location.query(relative), retrieve=True, keep_local=False)

    def exists(self, relative: str) -> bool:
        """Whether a file or directory exists in the store."""
        try:
            return bool(self._object(relative).exists())
        except Exception as exc:  # the plugins raise their backend's own errors
            raise StoreError(f"store {self.location.root}: cannot check {relative}: {exc}") from exc

    def put(self, local: Path, relative: str) -> None:
        """Copy a local file or directory to `relative` in the store, replacing what was there."""
        obj = self._object(relative)
        staged = Path(obj.local_path())
        _clear(staged)
        staged.parent.mkdir(parents=True, exist_ok=True)
        if local.is_dir():
            shutil.copytree(local, staged, ignore=shutil.ignore_patterns(MANIFEST))
        else:
            shutil.copy2(local, staged)
        try:
            if local.is_dir() and obj.exists():
                obj.remove()
            obj.store_object()
        except Exception as exc:
            raise StoreError(f"store {self.location.root}: cannot write {relative}: {exc}") from exc
        finally:
            _clear(staged)

    def get(self, relative: str, local: Path) -> bool:
        """Copy `relative` (file or directory) from the store to `local`; False when the store has no such object."""
        obj = self._object(relative)
        staged = Path(obj.local_path())
        staged.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not obj.exists():
                return False
            obj.retrieve_object()
        except Exception as exc:
            raise StoreError(f"store {self.location.root}: cannot read {relative}: {exc}") from exc
        local.parent.mkdir(parents=True, exist_ok=True)
        if staged.is_dir():
            shutil.copytree(staged, local, dirs_exist_ok=True)
        else:
            shutil.copy2(staged, local)
        _clear(staged)
        return True


def _clear(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def manifest_of(unit_dir: Path, paths: Iterable[Path] | None = None) -> dict[str, Any]:
    """Every file of a unit (but the manifest; or only `paths`) with its size and mtime, as pushed."""
    if paths is None:
        paths = sorted(p for p in unit_dir.rglob("*") if p.is_file() and p.name != MANIFEST)
    files = {}
    for path in paths:
        stat = path.stat()
        files[path.relative_to(unit_dir).as_posix()] = {"size": stat.st_size, "mtime": stat.st_mtime}
    return {"files": files, "host": socket.gethostname(),
            "stored_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def push_unit(store: StudyStore, workdir: Path, unit: str, marker: Path) -> dict[str, Any]:
    """Copy a finished unit's directory (`results/points/<id>`, relative to `workdir`) to the same path in the
    store, then its manifest (last), and write the manifest to `marker`."""
    unit_dir = Path(workdir) / unit
    if not unit_dir.is_dir():
        raise StoreError(f"store {store.location.root}: {unit_dir} is not a directory")
    return _push(store, unit_dir, unit, {"unit": unit, **manifest_of(unit_dir)}, Path(marker))


def _push(store: StudyStore, local: Path, unit: str, manifest: dict[str, Any], marker: Path) -> dict[str, Any]:
    """Copy `local` (a unit's directory or file) to `unit` in the store, its former manifest removed first, then
    the manifest, written to `marker`, last."""
    remote_manifest = manifest_path(unit)
    if store.exists(remote_manifest):
        store._object(remote_manifest).remove()
    store.put(local, unit)
    write_json_atomic(marker, manifest)
    store.put(marker, remote_manifest)
    return manifest


def manifest_path(unit: str) -> str:
    """Where a unit's manifest lies in the store: `<unit>/stored.json`, or `<name>.stored.json` beside a one-file
    unit (a preflight result, `<name>.json`)."""
    return f"{unit.removesuffix('.json')}.stored.json" if unit.endswith(".json") else f"{unit}/{MANIFEST}"


def push_file(store: StudyStore, workdir: Path, unit: str) -> dict[str, Any]:
    """Copy a one-file unit (a preset's preflight result, relative to `workdir`) to the same path in the store,
    then its manifest (last)."""
    path = Path(workdir) / unit
    manifest = {"unit": unit, **manifest_of(path.parent, [path])}
    with tempfile.TemporaryDirectory(prefix="ddsweep-push-") as scratch:
        return _push(store, path, unit, manifest, Path(scratch) / MANIFEST)


def _file_manifest(store: StudyStore, unit: str, scratch: Path) -> dict[str, Any] | None:
    """The manifest of a one-file unit in the store, or its entry in the preflights' former directory manifest."""
    for remote in (manifest_path(unit), f"{LEGACY_PREFLIGHTS}/{MANIFEST}"):
        if store.get(remote, scratch / "manifest.json"):
            manifest = read_json(scratch / "manifest.json")
            name = Path(unit).name
            if name in manifest["files"]:
                return {**manifest, "files": {name: manifest["files"][name]}}
    return None


def _pull_file(store: StudyStore, workdir: Path, unit: str) -> bool:
    """Restore a one-file unit that the store holds and this directory lacks, with its stored mtime."""
    local = Path(workdir) / unit
    if local.exists():
        return False
    with tempfile.TemporaryDirectory(prefix="ddsweep-pull-") as scratch:
        manifest = _file_manifest(store, unit, Path(scratch))
        if manifest is None:
            return False
        store.get(unit, Path(scratch) / local.name)
        if not _complete(Path(scratch), manifest):
            raise StoreError(f"store {store.location.root}: {unit} does not match its manifest (missing or of "
                             "another size); not restored")
        _restore(Path(scratch), local.parent, manifest)
    return True


def _restore(staged: Path, local: Path, manifest: dict[str, Any]) -> None:
    """Copy the files of a unit's manifest from `staged` to `local`, each with its stored mtime."""
    for name, meta in manifest["files"].items():
        target = local / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(staged / name, target)
        os.utime(target, (meta["mtime"], meta["mtime"]))


@dataclass
class PullReport:
    """What a pull found: units restored from the store, and units whose attempts were interrupted."""

    restored: list[str]
    interrupted: dict[str, list[dict[str, Any]]]
    # units the store holds finished under another configuration (their point.json's record_digest): not restored
    stale: list[str] = field(default_factory=list)


def _complete(unit_dir: Path, manifest: dict[str, Any]) -> bool:
    """Whether every file the manifest lists arrived with its size."""
    return all((unit_dir / name).is_file() and (unit_dir / name).stat().st_size == meta["size"]
               for name, meta in manifest["files"].items())


def _finished_here(unit_dir: Path) -> bool:
    """Whether this directory holds the unit finished (`done.json` ok) though not stored: a run after the stored
    copy whose push did not happen; the store's older copy must not replace it, and the push comes next."""
    try:
        return read_json(unit_dir / "done.json").get("status") == "ok"
    except (OSError, ValueError, AttributeError):
        return False


def _stale(staged: Path, expected: str | None) -> bool:
    """Whether a stored unit was measured under another configuration than `expected` (its point.json's
    record_digest differs; a unit without one, stored by an earlier version, cannot tell and is taken)."""
    try:
        digest = read_json(staged / "point.json").get("record_digest")
    except (OSError, ValueError, AttributeError):
        return False
    return expected is not None and digest is not None and digest != expected


def pull(store: StudyStore, workdir: Path, units: Iterable[str],
         digests: Mapping[str, str] | None = None) -> PullReport:
    """Restore under `workdir` every unit of `units` that the store holds finished and this directory lacks (the
    files keep their stored mtimes, so Snakemake finds them up to date), never over a unit finished here, and not
    one measured under another configuration than `digests` gives it (it runs again); for the others, fetch their
    attempt markers and report the attempts that started and never ended."""
    report = PullReport([], {})
    for unit in units:
        if unit.endswith(".json"):
            if _pull_file(store, workdir, unit):
                report.restored.append(unit)
            continue
        local = Path(workdir) / unit
        remote = unit
        if (local / MANIFEST).exists() or _finished_here(local):
            continue
        with tempfile.TemporaryDirectory(prefix="ddsweep-pull-") as scratch:
            fetched = Path(scratch) / MANIFEST
            if store.get(manifest_path(remote), fetched):
                manifest = read_json(fetched)
                staged = Path(scratch) / "unit"
                store.get(remote, staged)
                if not _complete(staged, manifest):
                    raise StoreError(f"store {store.location.root}: {remote} does not match its manifest (a file is "
                                     "missing or of another size); not restored")
                if _stale(staged, (digests or {}).get(unit)):
                    report.stale.append(unit)
                    continue
                _restore(staged, local, manifest)
                write_json_atomic(local / MANIFEST, manifest)
                # the manifest as old as the unit's newest file, as where it was written after them
                newest = max((meta["mtime"] for meta in manifest["files"].values()), default=None)
                if newest is not None:
                    os.utime(local / MANIFEST, (newest, newest))
                report.restored.append(unit)
                continue
            store.get(f"{remote}/{STARTED}", local / STARTED)
        lost = interrupted_attempts(local)
        if lost:
            report.interrupted[unit] = lost
    return report


def attempt_id(started_utc: str, host: str, pid: int) -> str:
    """A unique, sortable name for one attempt of a job."""
    stamp = started_utc.replace("-", "").replace(":", "").replace("+0000", "Z").replace("+00:00", "Z")
    return f"{stamp}-{host}-{pid}"


def mark_attempt(unit_dir: Path, attempt: str, phase: str, info: dict[str, Any], store: StudyStore | None,
                 unit: str | None) -> Path:
    """Write `<unit>/started/<attempt>.<phase>.json` (phase `start` or `end`), and copy it to the store at once."""
    path = Path(unit_dir) / STARTED / f"{attempt}.{phase}.json"
    write_json_atomic(path, {"attempt": attempt, "phase": phase, **info})
    if store is not None and unit is not None:
        store.put(path, f"{unit}/{STARTED}/{path.name}")
    return path


def attempts_of(unit_dir: Path) -> list[dict[str, Any]]:
    """Every attempt marked in `<unit>/started/`, oldest first: its start, and its end when it wrote one."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((Path(unit_dir) / STARTED).glob("*.json")):
        try:
            mark = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        entry = found.setdefault(str(mark.get("attempt")), {"attempt": mark.get("attempt")})
        entry[str(mark.get("phase"))] = mark
    return [found[k] for k in sorted(found)]


def interrupted_attempts(unit_dir: Path, current: str | None = None) -> list[dict[str, Any]]:
    """The attempts that never finished: a start with no end (the machine was lost, or the job killed), or an end
    that records an interruption (a signal, a time limit); `current` (the attempt now running) aside."""
    lost = []
    for entry in attempts_of(unit_dir):
        if entry["attempt"] == current or "start" not in entry:
            continue
        end = entry.get("end")
        if end is None or end.get("error_kind") == "interrupted":
            start = entry["start"]
            lost.append({"attempt": entry["attempt"], "host": start.get("host"),
                         "started_utc": start.get("started_utc"),
                         "ended_utc": end.get("ended_utc") if end else None,
                         "how": (end.get("reason") if end else None) or "no end recorded: the job or its machine was "
                                "lost mid-way"})
    return lost


def _push_command(args: argparse.Namespace) -> int:
    """`ddsweep store push`: copy one finished unit to the store (the workflow's store_unit rule)."""
    try:
        manifest = push_unit(StudyStore.open(args.store), Path(args.workdir), args.unit, Path(args.write))
    except StoreError as exc:
        print(f"ddsweep store push: {exc}", file=sys.stderr)
        return 1
    print(f"stored {args.unit}: {len(manifest['files'])} file(s) in {args.store}", file=sys.stderr)
    return 0


def _pull_command(args: argparse.Namespace) -> int:
    """`ddsweep store pull`: restore the finished units of the store into this results directory."""
    try:
        report = pull(StudyStore.open(args.store), Path(args.workdir), args.units)
    except StoreError as exc:
        print(f"ddsweep store pull: {exc}", file=sys.stderr)
        return 1
    print(describe_pull(report, args.store))
    return 0


def describe_pull(report: PullReport, url: str) -> str:
    """What a pull restored and which units were interrupted, one line each."""
    lines = [f"ddsweep: {len(report.restored)} finished job(s) taken from the store {url}"]
    if report.stale:
        lines.append(f"ddsweep: {len(report.stale)} finished job(s) in the store were measured under another "
                     f"configuration than this one and run again: {', '.join(report.stale)}")
    for unit, lost in sorted(report.interrupted.items()):
        last = lost[-1]
        lines.append(f"ddsweep: {unit} was interrupted ({len(lost)} attempt(s); the last started on {last['host']} "
                     f"at {last['started_utc']}: {last['how']}); it runs again, whole")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `store` subcommand (push, pull)."""
    parser = subparsers.add_parser("store", help="copy finished jobs to the study store, or take them from it",
                                   description=__doc__)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    push = verbs.add_parser("push", help="copy one finished unit (e.g. points/<id>) to the store, manifest last")
    push.add_argument("--store", required=True, help="absolute path or s3://BUCKET/PREFIX")
    push.add_argument("--workdir", default=".", help="the study's working directory (default .)")
    push.add_argument("--unit", required=True, help="the unit's directory, e.g. results/points/<id> or reports")
    push.add_argument("--write", required=True, metavar="FILE", help="where to write the manifest locally")
    push.set_defaults(func=_push_command)
    get = verbs.add_parser("pull", help="restore finished units from the store into a results directory")
    get.add_argument("--store", required=True, help="absolute path or s3://BUCKET/PREFIX")
    get.add_argument("--workdir", default=".", help="the study's working directory (default .)")
    get.add_argument("units", nargs="+",
                     help="units to restore, e.g. results/points/<id> results/preflight/<preset>.json")
    get.set_defaults(func=_pull_command)


def store_units(presets: Iterable[str], points: Iterable[str], launches: int) -> list[str]:
    """The units of a grid study that the store holds: each preset's preflight result, each point's and each
    launch's directory."""
    units = [f"results/preflight/{preset}.json" for preset in presets]
    for point in points:
        units.append(f"results/points/{point}")
        if launches > 1:
            units += [f"results/launches/{point}/launch-{k}" for k in range(launches)]
    return units
