"""A grid study's launches: each point's repeats split across `sweep.launches` server launches.

The variation that separates two configurations in practice is between server launches and nodes, so a grid
point is measured in several launches (separate jobs, scheduled launch by launch across the points, so that a
point's launches are interleaved with other points'), each running its share of the repeats, the coding eval
in the last. `ddsweep merge-launches` joins them into the point's directory and the summary treats the launch as
the independent unit (ddsweep.analysis.launch_model)."""

from __future__ import annotations

from ddsweep.config.operational import record_digest
from ddsweep.config.points import Point
from ddsweep.config.records import point_record


def launch_count(config: dict) -> int:
    """Server launches a measured point's repeats are split across: `sweep.launches`, at most one per repeat (a
    one-repeat study, such as the smoke study, runs one launch). An adaptive study's confirmation uses it too."""
    repeats = int(config.get("benchmark", {}).get("repeats", 3))
    return max(1, min(int(config.get("sweep", {}).get("launches", 2)), repeats))


def grid_launches(config: dict) -> int:
    """Server launches per grid point (`launch_count`), and 1 for an adaptive study, whose confirmation launches
    are its own."""
    if config.get("sweep", {}).get("strategy") == "adaptive":
        return 1
    return launch_count(config)


def split_repeats(repeats: int, launches: int) -> list[int]:
    """`repeats` split across `launches` as evenly as possible, the earlier launches first."""
    return [repeats // launches + (1 if k < repeats % launches else 0) for k in range(launches)]


def launch_repeats(config: dict) -> list[int]:
    """Repeats of each grid launch: the configured repeats split as evenly as possible, the earlier launches
    first."""
    return split_repeats(int(config["benchmark"].get("repeats", 3)), grid_launches(config))


def launch_record(config: dict, point: Point, launch: int) -> dict:
    """The run-point record of launch `launch` of a grid point: its share of the repeats, and the coding eval only
    in the last launch (the eval does not measure speed, one launch suffices)."""
    shares = launch_repeats(config)
    record = point_record(config, point)
    record["benchmark"] = {**record["benchmark"], "repeats": shares[launch]}
    if launch != len(shares) - 1:
        record["coding_eval"] = {**record["coding_eval"], "enabled": False}
    record["launch"] = launch
    return record


def job_digests(config: dict, points: dict[str, Point]) -> dict[str, str]:
    """Each grid job directory's expected `record_digest` (results/launches/<id>/launch-<k>, or results/points/<id>
    where a point runs in one launch; a point merged from its launches is checked through them)."""
    launches = grid_launches(config)
    if launches == 1:
        return {f"results/points/{pid}": record_digest(point_record(config, p)) for pid, p in points.items()}
    return {f"results/launches/{pid}/launch-{k}": record_digest(launch_record(config, p, k))
            for pid, p in points.items() for k in range(launches)}

