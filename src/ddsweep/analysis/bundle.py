"""`ddsweep bundle create|verify`: archive a study's reports, tables, config and per-point records, and check one.

A bundle is ``{study}-{YYYYmmddTHHMMSSZ}-{hash8}.tar.gz`` where hash8 starts the SHA-256 of its manifest. Inside,
every file sits under one top-level directory named like the bundle, next to ``MANIFEST.sha256`` in
``sha256sum`` format, so ``sha256sum -c MANIFEST.sha256`` also works in the extracted directory. Bundles are
written to a temporary file and hard-linked into place, so an existing bundle is never overwritten and a bundle
that exists is complete.
"""

from __future__ import annotations

import argparse
import hashlib
import io
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
                  now: float | None = None) -> Path:
    """Write a new bundle into OUT_DIR (default REPORTS_DIR/bundles) and return its path; never overwrites."""
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
    fd, tmp_name = tempfile.mkstemp(prefix=f".{stem}.", suffix=".tmp", dir=out_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                _add_bytes(tar, f"{stem}/{MANIFEST}", manifest, now)
                for name in sorted(files):
                    tar.add(files[name], arcname=f"{stem}/{name}", recursive=False)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, default_file_mode())
        return _link_exclusive(tmp, out_dir, stem)
    finally:
        tmp.unlink(missing_ok=True)


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


def _read_members(path: Path, report: VerifyReport) -> tuple[dict[str, str], bytes | None]:
    """Hash every regular member (path below the top directory) and return the manifest's bytes."""
    actual: dict[str, str] = {}
    manifest_bytes: bytes | None = None
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
                    manifest_bytes = data
                elif name in actual:
                    report.problems.append(f"{name} appears more than once")
                else:
                    actual[name] = hashlib.sha256(data).hexdigest()
    except (OSError, tarfile.TarError, EOFError) as exc:
        report.problems.append(f"cannot read {path} as a .tar.gz: {exc}")
    return actual, manifest_bytes


def verify_bundle(path: Path) -> VerifyReport:
    """Check every file of a bundle against its manifest: missing, extra and changed files, unsafe members."""
    report = VerifyReport()
    actual, manifest_bytes = _read_members(Path(path), report)
    if report.problems and not actual and manifest_bytes is None:
        return report
    if manifest_bytes is None:
        report.problems.append(f"{MANIFEST} is missing")
        report.extra = sorted(actual)
        return report
    expected: dict[str, str] = {}
    for number, line in enumerate(manifest_bytes.decode("utf-8", errors="replace").splitlines(), start=1):
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line)
        if not match:
            report.problems.append(f"{MANIFEST} line {number} is malformed: {line!r}")
            continue
        expected[match.group(2)] = match.group(1)
    report.missing = sorted(set(expected) - set(actual))
    report.extra = sorted(set(actual) - set(expected))
    report.changed = sorted(n for n in set(expected) & set(actual) if expected[n] != actual[n])
    report.checked = len(set(expected) & set(actual))
    name_match = NAME_PATTERN.match(Path(path).name)
    if name_match and hashlib.sha256(manifest_bytes).hexdigest()[:8] != name_match.group("hash"):
        report.problems.append("the manifest's hash does not match the hash in the bundle's name "
                               "(the manifest was altered)")
    return report


def _run_create(args: argparse.Namespace) -> int:
    """CLI handler of `bundle create`."""
    try:
        path = create_bundle(args.study, Path(args.results), Path(args.reports), Path(args.config),
                             Path(args.out) if args.out else None)
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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bundle` subcommand with `create` and `verify`."""
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
    verify = actions.add_parser("verify", help="check every file of a bundle against its manifest")
    verify.add_argument("file", metavar="FILE")
    verify.set_defaults(func=_run_verify)
