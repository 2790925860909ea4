"""`ddsweep bundle create|verify|extract|prune`: archive a study's reports, tables, config and per-point records.

A bundle is ``{study}-{YYYYmmddTHHMMSSZ}-{hash8}.tar.gz`` where hash8 starts the SHA-256 of its manifest. Inside,
every file sits under one top-level directory named like the bundle, next to ``MANIFEST.sha256`` in
``sha256sum`` format, which lists every file of the study at that moment. Each file is stored once: a bundle
stores only the files that are not in the previous bundle of the same study with the same content, and names
that bundle in ``BASE.json`` (its name and the SHA-256 of its manifest); `verify` and `extract` follow the
chain, and `prune --keep N` makes the oldest bundle it keeps whole before deleting the older ones. Bundles are
written to a temporary file and hard-linked into place, so an existing bundle is never overwritten (`prune`
rewrites a kept bundle with the same manifest in place) and a bundle that exists is complete.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ddsweep.config.study import configured_point_ids
from ddsweep.storage import default_file_mode, write_json_atomic

MANIFEST = "MANIFEST.sha256"
BASE = "BASE.json"
POINT_SUFFIXES = (".json", ".jsonl", ".log")
NAME_PATTERN = re.compile(r"^(?P<study>.+)-(?P<stamp>\d{8}T\d{6}Z)-(?P<hash>[0-9a-f]{8})(?:-\d+)?\.tar\.gz$")


@dataclass
class VerifyReport:
    """The outcome of checking a bundle against its manifest."""

    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def ok(self) -> bool:
        """True when every file matches the manifest and nothing is missing or extra."""
        return not (self.missing or self.extra or self.changed or self.problems)


def _sha256(path: Path) -> str:
    """SHA-256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def collect_files(results_dir: Path, reports_dir: Path, config: Path) -> dict[str, Path]:
    """Map archive paths to files: summary (Markdown and JSON), plots, tables, config, plan, job logs, and every
    point's logs and JSON (only the points of the study when the config is a full study configuration)."""
    files: dict[str, Path] = {}
    for name in ("optimization_summary.md", "summary.json"):
        if (reports_dir / name).is_file():
            files[f"reports/{name}"] = reports_dir / name
    for pattern in ("*.png", "*.svg"):
        for plot in sorted((reports_dir / "plots").glob(pattern)):
            files[f"reports/plots/{plot.name}"] = plot
    for table in sorted((results_dir / "tables").glob("*.csv")):
        files[f"results/tables/{table.name}"] = table
    files[f"config/{config.name}"] = config
    if (results_dir / "plan.json").is_file():
        files["results/plan.json"] = results_dir / "plan.json"
    for log in sorted((results_dir / "logs").rglob("*.log")):
        files[f"results/logs/{log.relative_to(results_dir / 'logs').as_posix()}"] = log
    try:
        study_points = configured_point_ids(yaml.safe_load(config.read_text(encoding="utf-8")))
    except yaml.YAMLError:
        study_points = None
    points = results_dir / "points"
    if points.is_dir():
        for path in sorted(points.rglob("*")):
            relative = path.relative_to(points)
            if study_points is not None and relative.parts[0] not in study_points:
                continue
            if path.is_file() and not path.is_symlink() and path.suffix in POINT_SUFFIXES \
                    and not path.name.startswith("."):
                files[f"results/points/{relative.as_posix()}"] = path
    return files


def manifest_text(hashes: dict[str, str]) -> str:
    """The manifest in sha256sum format, one 'HASH  PATH' line per file, sorted by path."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(hashes.items()))


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    """Add an in-memory file to the archive."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def create_bundle(study: str, results_dir: Path, reports_dir: Path, config: Path, out_dir: Path | None = None,
                  now: float | None = None, full: bool = False) -> Path:
    """Write a new bundle into OUT_DIR (default REPORTS_DIR/bundles) and return its path; never overwrites. The
    files the study's latest bundle there holds with the same content are referenced, not stored (`full`:
    store every file)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", study):
        raise ValueError(f"study name {study!r} is not usable in a file name")
    config = Path(config)
    if not config.is_file():
        raise FileNotFoundError(f"config file {config} does not exist")
    files = collect_files(Path(results_dir), Path(reports_dir), config)
    hashes = {name: _sha256(path) for name, path in files.items()}
    manifest = manifest_text(hashes).encode("utf-8")
    now = time.time() if now is None else now
    stem = f"{study}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}-{hashlib.sha256(manifest).hexdigest()[:8]}"
    out_dir = Path(out_dir) if out_dir else Path(reports_dir) / "bundles"
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = None if full else next(reversed(bundles_of(out_dir).get(study, [])), None)
    base, referenced = None, set()
    if previous is not None:
        base_manifest = read_manifest(previous)
        if base_manifest is not None:
            base = {"bundle": previous.name, "manifest_sha256": hashlib.sha256(base_manifest).hexdigest()}
            listed = parse_manifest(base_manifest)
            referenced = {name for name, digest in hashes.items() if listed.get(name) == digest}
    stored = {name: files[name] for name in files if name not in referenced}
    return _write_bundle(out_dir, stem, manifest, base, stored, now)


def _write_bundle(out_dir: Path, stem: str, manifest: bytes, base: dict | None, stored: dict[str, Path | bytes],
                  now: float, replace: Path | None = None) -> Path:
    """Write MANIFEST, BASE.json (when `base`) and the stored files (paths, or bytes) to a temporary file, then
    give it its name (or atomically `replace` an existing bundle with the same manifest)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{stem}.", suffix=".tmp", dir=out_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                _add_bytes(tar, f"{stem}/{MANIFEST}", manifest, now)
                if base is not None:
                    _add_bytes(tar, f"{stem}/{BASE}", json.dumps(base, sort_keys=True).encode(), now)
                for name in sorted(stored):
                    source = stored[name]
                    if isinstance(source, bytes):
                        _add_bytes(tar, f"{stem}/{name}", source, now)
                    else:
                        tar.add(source, arcname=f"{stem}/{name}", recursive=False)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, default_file_mode())
        if replace is not None:
            os.replace(tmp, replace)
            return replace
        return _link_exclusive(tmp, out_dir, stem)
    finally:
        tmp.unlink(missing_ok=True)


def bundles_of(directory: Path) -> dict[str, list[Path]]:
    """Study -> its bundles in DIRECTORY, oldest first (by the time in the name, then the name)."""
    found: dict[str, list[tuple[str, str, Path]]] = {}
    for path in Path(directory).glob("*.tar.gz"):
        match = NAME_PATTERN.match(path.name)
        if match:
            found.setdefault(match.group("study"), []).append((match.group("stamp"), path.name, path))
    return {study: [p for _, _, p in sorted(entries)] for study, entries in found.items()}


def read_manifest(path: Path) -> bytes | None:
    """The manifest of a bundle (its first member), or None when unreadable."""
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in tar:
                if member.isfile() and member.name.split("/", 1)[-1] == MANIFEST:
                    handle = tar.extractfile(member)
                    return handle.read() if handle else None
    except (OSError, tarfile.TarError, EOFError):
        return None
    return None


def parse_manifest(data: bytes, problems: list[str] | None = None) -> dict[str, str]:
    """Path -> SHA-256 from a manifest; malformed lines are reported into `problems`."""
    listed: dict[str, str] = {}
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line)
        if match:
            listed[match.group(2)] = match.group(1)
        elif problems is not None:
            problems.append(f"{MANIFEST} line {number} is malformed: {line!r}")
    return listed


def _link_exclusive(tmp: Path, out_dir: Path, stem: str) -> Path:
    """Give the finished temporary file its final name without replacing any file (adds -1, -2 … if taken)."""
    for attempt in range(1000):
        target = out_dir / (f"{stem}.tar.gz" if attempt == 0 else f"{stem}-{attempt}.tar.gz")
        try:
            os.link(tmp, target)
        except FileExistsError:
            continue
        return target
    raise FileExistsError(f"no free bundle name for {stem} in {out_dir}")


@dataclass
class _Members:
    """What one bundle file holds: the SHA-256 (and, when asked, the bytes) of each stored file, its manifest and
    its BASE.json."""

    hashes: dict[str, str] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)
    manifest: bytes | None = None
    base: dict | None = None


def _read_members(path: Path, report: VerifyReport, keep_data: bool = False) -> _Members:
    """Hash every regular member (path below the top directory); read the manifest and BASE.json."""
    found = _Members()
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in tar:
                parts = member.name.split("/")
                if member.name.startswith("/") or ".." in parts or len(parts) < 2:
                    report.problems.append(f"unsafe or misplaced member {member.name!r}")
                    continue
                if member.isdir():
                    continue
                if not member.isfile():
                    report.problems.append(f"member {member.name!r} is not a regular file")
                    continue
                name = "/".join(parts[1:])
                handle = tar.extractfile(member)
                data = handle.read() if handle else b""
                if name == MANIFEST:
                    found.manifest = data
                elif name == BASE:
                    found.base = json.loads(data)
                elif name in found.hashes:
                    report.problems.append(f"{name} appears more than once")
                else:
                    found.hashes[name] = hashlib.sha256(data).hexdigest()
                    if keep_data:
                        found.data[name] = data
    except (OSError, tarfile.TarError, EOFError, ValueError) as exc:
        report.problems.append(f"cannot read {path} as a .tar.gz: {exc}")
    return found


def _base_path(path: Path, base: dict, report: VerifyReport) -> Path | None:
    """The bundle a BASE.json names (next to PATH), when it is there and has the manifest named."""
    target = Path(path).parent / str(base.get("bundle"))
    manifest = read_manifest(target) if target.is_file() else None
    if manifest is None:
        report.problems.append(f"the base bundle {base.get('bundle')} is not next to {Path(path).name} (its files "
                               "are referenced, not stored)")
        return None
    if hashlib.sha256(manifest).hexdigest() != base.get("manifest_sha256"):
        report.problems.append(f"the base bundle {base.get('bundle')} has another manifest than the one referenced")
        return None
    return target


def verify_bundle(path: Path) -> VerifyReport:
    """Check every file of a bundle against its manifest: missing, extra and changed files, unsafe members; a file
    the bundle references is checked in its base bundle (verified in turn)."""
    report = VerifyReport()
    found = _read_members(Path(path), report)
    actual, manifest_bytes = found.hashes, found.manifest
    if report.problems and not actual and manifest_bytes is None:
        return report
    if manifest_bytes is None:
        report.problems.append(f"{MANIFEST} is missing")
        report.extra = sorted(actual)
        return report
    expected = parse_manifest(manifest_bytes, report.problems)
    absent = set(expected) - set(actual)
    resolved: set[str] = set()
    if absent and found.base is not None:
        base_path = _base_path(Path(path), found.base, report)
        if base_path is not None:
            base_report = verify_bundle(base_path)
            report.problems += [f"base {base_path.name}: {p}" for p in base_report.problems]
            listed = parse_manifest(read_manifest(base_path) or b"")
            bad = set(base_report.missing) | set(base_report.changed)
            resolved = {n for n in absent if listed.get(n) == expected[n] and n not in bad}
    report.missing = sorted(absent - resolved)
    report.extra = sorted(set(actual) - set(expected))
    report.changed = sorted(n for n in set(expected) & set(actual) if expected[n] != actual[n])
    report.checked = len(set(expected) & set(actual)) + len(resolved)
    name_match = NAME_PATTERN.match(Path(path).name)
    if name_match and hashlib.sha256(manifest_bytes).hexdigest()[:8] != name_match.group("hash"):
        report.problems.append("the manifest's hash does not match the hash in the bundle's name "
                               "(the manifest was altered)")
    return report


class BundleError(RuntimeError):
    """A bundle cannot be read whole (a member unreadable, a base bundle missing or changed)."""


def bundle_files(path: Path) -> tuple[bytes, dict[str, bytes]]:
    """A bundle's manifest and every file it lists, the referenced ones read from its base chain; BundleError
    when one cannot be found."""
    report = VerifyReport()
    found = _read_members(Path(path), report, keep_data=True)
    if found.manifest is None or report.problems:
        raise BundleError(f"{path}: " + "; ".join(report.problems or [f"{MANIFEST} is missing"]))
    expected = parse_manifest(found.manifest)
    files = {name: found.data[name] for name in expected if name in found.data}
    absent = [name for name in expected if name not in files]
    if absent:
        base_path = _base_path(Path(path), found.base, report) if found.base else None
        if base_path is None:
            raise BundleError(f"{path}: {len(absent)} file(s) neither stored nor found in a base bundle; "
                              + "; ".join(report.problems))
        base_files = bundle_files(base_path)[1]
        files.update({name: base_files[name] for name in absent if name in base_files})
    wrong = [n for n in expected if n not in files or hashlib.sha256(files[n]).hexdigest() != expected[n]]
    if wrong:
        raise BundleError(f"{path}: {len(wrong)} file(s) missing or changed in the chain, e.g. {wrong[0]}")
    return found.manifest, files


def extract_bundle(path: Path, dest: Path) -> Path:
    """Write every file of a bundle (stored or referenced) under DEST/<bundle stem>/ with its manifest."""
    manifest, files = bundle_files(Path(path))
    top = Path(dest) / Path(path).name.removesuffix(".tar.gz")
    for name, data in {MANIFEST: manifest, **files}.items():
        target = top / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return top


def prune_bundles(directory: Path, keep: int) -> list[Path]:
    """Keep the newest KEEP bundles of each study in DIRECTORY and delete the others; a kept bundle whose base is
    deleted is first rewritten whole (same manifest, same name). Returns the deleted paths."""
    if keep < 1:
        raise ValueError("--keep must be at least 1")
    removed: list[Path] = []
    for paths in bundles_of(Path(directory)).values():
        drop = set(paths[:-keep])
        for path in paths[-keep:]:
            members = _read_members(path, VerifyReport())
            if members.base is not None and Path(directory) / str(members.base.get("bundle")) in drop:
                manifest, files = bundle_files(path)
                _write_bundle(Path(directory), path.name.removesuffix(".tar.gz"), manifest, None, files,
                              path.stat().st_mtime, replace=path)
        for path in sorted(drop):
            path.unlink()
            removed.append(path)
    return removed


def _run_create(args: argparse.Namespace) -> int:
    """CLI handler of `bundle create`."""
    try:
        path = create_bundle(args.study, Path(args.results), Path(args.reports), Path(args.config),
                             Path(args.out) if args.out else None, full=args.full)
    except (OSError, ValueError) as exc:
        print(f"ddsweep bundle create: {exc}", file=sys.stderr)
        return 1
    if args.record:
        write_json_atomic(args.record, {"bundle": str(path), "sha256": _sha256(path),
                                        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    print(path)
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    """CLI handler of `bundle verify`: prints every problem, exit code 1 on any."""
    report = verify_bundle(Path(args.file))
    for label, names in (("missing", report.missing), ("extra", report.extra), ("changed", report.changed)):
        for name in names:
            print(f"{label}: {name}")
    for problem in report.problems:
        print(f"problem: {problem}")
    if report.ok:
        print(f"OK: {report.checked} files match {MANIFEST}")
        return 0
    print(f"FAILED: {len(report.missing)} missing, {len(report.extra)} extra, {len(report.changed)} changed, "
          f"{len(report.problems)} other problem(s)", file=sys.stderr)
    return 1


def _run_extract(args: argparse.Namespace) -> int:
    """CLI handler of `bundle extract`."""
    try:
        print(extract_bundle(Path(args.file), Path(args.to)))
    except (OSError, BundleError) as exc:
        print(f"ddsweep bundle extract: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_prune(args: argparse.Namespace) -> int:
    """CLI handler of `bundle prune`."""
    try:
        removed = prune_bundles(Path(args.dir), args.keep)
    except (OSError, ValueError, BundleError) as exc:
        print(f"ddsweep bundle prune: {exc}", file=sys.stderr)
        return 1
    for path in removed:
        print(f"removed {path}")
    print(f"kept the newest {args.keep} bundle(s) of each study in {args.dir}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bundle` subcommand with `create`, `verify`, `extract` and `prune`."""
    parser = subparsers.add_parser("bundle", help="archive a study's results, or verify an archive",
                                   description=__doc__.splitlines()[0])
    actions = parser.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="write a new report bundle (.tar.gz with a SHA-256 manifest)")
    create.add_argument("--study", required=True, help="study name (first part of the bundle name)")
    create.add_argument("--results", required=True, metavar="RESULTS_DIR")
    create.add_argument("--reports", required=True, metavar="REPORTS_DIR")
    create.add_argument("--config", required=True, metavar="CONFIG", help="the study config file")
    create.add_argument("--out", metavar="DIR", help="where bundles go (default REPORTS_DIR/bundles)")
    create.add_argument("--record", metavar="FILE", help="also write FILE (JSON): the new bundle's path and sha256")
    create.set_defaults(func=_run_create)
    create.add_argument("--full", action="store_true",
                        help="store every file (a bundle that stands alone) instead of referencing the previous one")
    verify = actions.add_parser("verify", help="check every file of a bundle against its manifest")
    verify.add_argument("file", metavar="FILE")
    verify.set_defaults(func=_run_verify)
    extract = actions.add_parser("extract", help="write every file of a bundle, referenced ones included")
    extract.add_argument("file", metavar="FILE")
    extract.add_argument("--to", default=".", metavar="DIR", help="where to write <bundle name>/ (default .)")
    extract.set_defaults(func=_run_extract)
    prune = actions.add_parser("prune", help="keep the newest N bundles of each study, delete the older ones")
    prune.add_argument("--keep", type=int, required=True, metavar="N")
    prune.add_argument("--dir", default="reports/bundles", help="the bundles directory (default reports/bundles)")
    prune.set_defaults(func=_run_prune)
