"""`ddsweep preflight`: flag checking against the server's own parser, paths, partition, and the workflow gate."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from configs import study_yaml
from conftest import ROOT, copy_workflow, demo_config, venv_env

from ddsweep.cli import main
from ddsweep.config.study import expand_points, merge_config, validate_config
from ddsweep.point.preflight import (
    SHARED_FOR_S,
    STAND_IN_SETUP,
    Finding,
    ProbeResult,
    check_flags,
    check_host,
    check_partition,
    check_paths,
    flag_tokens,
    identify_parser,
    probe_arguments,
    run_preflight,
    suggest,
)

SGLANG = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not SGLANG, reason="sglang is not importable here; install its CPU argument "
                                  "parser with `.ci/sglang-real.sh .venv` to run the preflight against it")
SMALL_PARSER = "parser.add_argument('--block-size', type=int)\nparser.add_argument('--model-path', required=True)"


def _errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "error"]


def _with_typo(config: dict, preset: str, good: str, bad: str) -> dict:
    """A copy of the configuration with one flag of a preset misspelled."""
    config = copy.deepcopy(config)
    args = config["engine"]["presets"][preset]["args"]
    args[args.index(good)] = bad
    return validate_config(config)


def test_flag_tokens_keep_flags_and_drop_values():
    assert flag_tokens(["--speculative-dflash-blok-size", "8", "--x=3", "-5", "-1.5", "value"]) == [
        "--speculative-dflash-blok-size", "--x"]


def test_suggest_finds_the_closest_option_or_nothing():
    options = ["-h", "--speculative-dflash-block-size", "--speculative-draft-window-size", "--port"]
    assert suggest("--speculative-dflash-blok-size", options) == "--speculative-dflash-block-size"
    assert suggest("--completely-different", options) is None


def test_identify_parser_recognises_sglang_and_the_stand_in():
    sglang = identify_parser(["/opt/sgl/bin/python", "-m", "sglang.launch_server", "--port", "1"], 3)
    assert (sglang.name, sglang.python, sglang.args_start) == ("SGLang", "/opt/sgl/bin/python", 3)
    stand_in = identify_parser([sys.executable, "-m", "ddsweep", "sim-server", "--sim-seed", "7", "--port", "1"], 6)
    assert (stand_in.python, stand_in.setup, stand_in.args_start) == (sys.executable, STAND_IN_SETUP, 4)
    assert identify_parser(["ddsweep", "sim-server", "--port", "1"], 2).args_start == 2
    assert identify_parser(["/opt/run-sglang.sh", "--port", "1"], 1) is None


def test_probe_reports_unknown_flags_errors_and_options_of_a_small_parser():
    probe = probe_arguments(sys.executable, SMALL_PARSER, [
        ["--model-path", "m", "--block-size", "8"],
        ["--model-path", "m", "--blok-size", "8"],
        ["--model-path", "m", "--block-size", "eight"],
    ])
    assert probe.import_error is None
    assert "--block-size" in probe.options
    assert probe.results[0] == {"unknown": [], "error": None}
    assert probe.results[1]["unknown"] == ["--blok-size", "8"]
    assert "invalid int value" in probe.results[2]["error"]


def test_probe_reports_a_missing_server_package_as_an_import_error():
    probe = probe_arguments(sys.executable, "import ddsweep_no_such_module", [["--x"]])
    assert "ddsweep_no_such_module" in probe.import_error
    assert probe.results == []


def test_the_demo_commands_pass_the_stand_in_parser():
    config = demo_config()
    assert _errors(check_flags(config, expand_points(config))) == []


def test_a_misspelled_flag_is_reported_by_preset_and_point_with_a_suggestion():
    config = _with_typo(demo_config(), "dflash", "--speculative-dflash-block-size", "--speculative-dflash-blok-size")
    errors = _errors(check_flags(config, expand_points(config)))
    assert len(errors) == 1
    assert errors[0].preset == "dflash"
    assert errors[0].points == ("dflash-bs8-w2048",)
    assert "--speculative-dflash-blok-size" in errors[0].message
    assert "did you mean --speculative-dflash-block-size?" in errors[0].message
    assert "[preset dflash]" in errors[0].render() and "dflash-bs8-w2048" in errors[0].render()


def test_the_preflights_of_one_study_ask_the_parser_once_and_each_reports_only_its_preset(tmp_path, monkeypatch):
    config = _with_typo(demo_config(), "dflash", "--speculative-dflash-block-size", "--speculative-dflash-blok-size")
    asked = []

    def counted(python: str, setup: str, arg_lists: list[list[str]], prog: str = "server") -> ProbeResult:
        asked.append(len(arg_lists))
        return probe_arguments(python, setup, arg_lists, prog=prog)

    monkeypatch.setattr("ddsweep.point.preflight.probe_arguments", counted)
    shared = tmp_path / "shared"
    by_preset = {preset: _errors(run_preflight(config, [preset], shared)) for preset in ("ar", "dflash", "ddtree")}
    assert len(asked) == 1 and asked[0] > len({p.preset for p in expand_points(config)})  # every preset's commands
    assert by_preset["ar"] == [] and by_preset["ddtree"] == []
    assert [e.points for e in by_preset["dflash"]] == [("dflash-bs8-w2048",)]
    assert by_preset["dflash"] == _errors(run_preflight(config, ["dflash"]))  # as its own preflight alone says
    assert len(asked) == 2  # without the shared directory it asks again

    for answer in shared.glob("*.json"):  # an answer older than SHARED_FOR_S is asked again
        os.utime(answer, (time.time() - SHARED_FOR_S - 1,) * 2)
    run_preflight(config, ["ar"], shared)
    assert len(asked) == 3

    # a parser that could not be asked is not asked again by the next preset's preflight: each says why
    missing = demo_config(engine={"launcher": ["/no/such/python", *config["engine"]["launcher"][1:]]})
    notices = [[f.message for f in run_preflight(missing, [preset], shared) if "server flags" in f.message]
               for preset in ("ar", "dflash")]
    assert len(asked) == 4
    assert notices[0] == notices[1] and "'/no/such/python' was not found on this host" in notices[0][0]


def test_an_optional_flag_no_point_uses_yet_is_still_checked():
    config = demo_config(baselines={"dflash": {"block_size": [8], "window": [None]}})
    config["engine"]["presets"]["dflash"]["args_if_set"]["window"] = ["--speculative-draft-windw-size", "{window}"]
    errors = _errors(check_flags(config, [p for p in expand_points(config) if p.preset == "dflash"]))
    assert len(errors) == 1
    assert "--speculative-draft-windw-size" in errors[0].message
    assert errors[0].points == ("dflash-bs8 with every optional argument of its preset",)


def test_an_unrecognised_launcher_is_a_notice_not_an_error():
    config = demo_config(engine={"launcher": ["/opt/run-server.sh"]})
    findings = check_flags(config, expand_points(config))
    assert [f.level for f in findings] == ["notice"]
    assert "were not checked" in findings[0].message


def _real_config(tmp_path: Path, **sections: dict) -> dict:
    """The study configuration with model paths under tmp_path and the launcher given in sections."""
    config = study_yaml()
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "drafter").mkdir(exist_ok=True)
    config["target"]["model_path"] = str(tmp_path / "model")
    config["drafter"]["model_path"] = str(tmp_path / "drafter")
    config["resources"]["partition"] = None
    merge_config(config, sections)
    return validate_config(config)


def test_paths_must_exist_where_a_preset_uses_them(tmp_path):
    config = _real_config(tmp_path)
    points = expand_points(config)
    assert check_paths(config, points) == []
    config["drafter"]["model_path"] = str(tmp_path / "missing-drafter")
    errors = _errors(check_paths(config, points))
    assert len(errors) == 1 and errors[0].message.startswith("drafter.model_path: ")
    assert "ddtree, dflash" in errors[0].message
    assert check_paths(config, [p for p in points if p.preset == "ar"]) == []


def test_paths_are_not_checked_when_simulated_or_only_on_the_compute_nodes(tmp_path):
    config = _real_config(tmp_path)
    config["target"]["model_path"] = "/nonexistent/model"
    assert _errors(check_paths(config, expand_points(config)))
    config["resources"]["paths_on_submit_host"] = False
    assert [f.level for f in check_paths(config, expand_points(config))] == ["notice"]
    demo = demo_config()
    findings = check_paths(demo, expand_points(demo))
    assert [f.level for f in findings] == ["notice"] and "simulated" in findings[0].message


def test_a_hub_model_id_is_a_notice(tmp_path):
    config = _real_config(tmp_path)
    config["target"]["model_path"] = "moonshotai/Kimi-K2.6"
    findings = check_paths(config, expand_points(config))
    assert [f.level for f in findings] == ["notice"] and "model id" in findings[0].message


def test_a_host_other_machines_can_reach_is_a_notice():
    assert check_host(demo_config()) == []
    assert [f.level for f in check_host(demo_config(engine={"host": "0.0.0.0"}))] == ["notice"]


def test_the_partition_must_exist_in_slurm(tmp_path, monkeypatch):
    sinfo = tmp_path / "bin" / "sinfo"
    sinfo.parent.mkdir()
    sinfo.write_text("#!/bin/sh\nprintf 'debug\\ngpu\\ngpu\\n'\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{sinfo.parent}{os.pathsep}{os.environ['PATH']}")
    assert check_partition(demo_config(resources={"partition": "gpu"})) == []
    errors = check_partition(demo_config(resources={"partition": "gpus"}))
    assert [f.level for f in errors] == ["error"] and "debug, gpu" in errors[0].message


def test_the_command_line_fails_on_a_typo_and_writes_nothing(tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({"target": {"server_args": ["--speculative-dflash-blok-size", "8"]}}))
    out = tmp_path / "preflight.json"
    code = main(["preflight", "--config", str(ROOT / "config/config.yaml"), str(ROOT / ".test/config.yaml"),
                 str(typo), "--write", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert not out.exists()
    assert "did you mean --speculative-dflash-block-size?" in err
    assert "[preset ddtree]" in err and "bs16-b8-t4-w2048" in err


def test_under_record_the_command_line_writes_the_errors_and_succeeds(tmp_path, capsys):
    config = demo_config(sweep={"on_preflight_error": "record"},
                         target={"server_args": ["--speculative-dflash-blok-size", "8"]})
    out = tmp_path / "preflight.json"
    assert main(["preflight", "--config-json", json.dumps(config), "--preset", "ar", "--write", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["ok"] is False
    errors = [f for f in record["findings"] if f["level"] == "error"]
    assert len(errors) == 1 and errors[0]["points"] == ["ar"]
    assert "did you mean --speculative-dflash-block-size?" in errors[0]["message"]
    assert "recorded as failed (error kind preflight)" in capsys.readouterr().err
    # by hand (nothing to record into) it still fails
    assert main(["preflight", "--config-json", json.dumps(config), "--preset", "ar"]) == 1


def test_the_command_line_passes_the_demo_and_writes_its_findings(tmp_path):
    out = tmp_path / "preflight.json"
    study = json.dumps(demo_config())
    assert main(["preflight", "--config-json", study, "--preset", "ar", "--write", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["ok"] is True and record["scope"] == "preset(s) ar"
    assert main(["preflight", "--config-json", study, "--preset", "nope"]) == 2
    assert main(["preflight", "--config-json", "{not json"]) == 2


@pytest.mark.slow
@pytest.mark.full("runs Snakemake on a working copy of the workflow")
def test_the_workflow_starts_no_point_when_the_preflight_fails(tmp_path):
    copy_workflow(tmp_path)
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(
        {"target": {"server_args": ["--speculative-dflash-blok-size", "8"]}}))
    snakemake = Path(sys.executable).with_name("snakemake")
    done = subprocess.run([str(snakemake), "results/points/ar/done.json", "--cores", "2",
                           "--configfile", ".test/config.yaml", "typo.yaml"], cwd=tmp_path, env=venv_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert "Error in rule preflight" in done.stdout + done.stderr
    assert "did you mean --speculative-dflash-block-size?" in (tmp_path / "results/logs/preflight/ar.log").read_text()
    assert not (tmp_path / "results/points/ar").exists()


@pytest.fixture(scope="module")
def upstream_findings(tmp_path_factory) -> tuple[dict, list[Finding]]:
    """One preflight of the DFlash, autoregressive and DDTree presets against upstream SGLang's parser (one probe
    process for all their commands, as in a study: importing SGLang costs seconds of CPU)."""
    config = _real_config(tmp_path_factory.mktemp("preflight"),
                          engine={"launcher": [sys.executable, "-m", "sglang.launch_server"]})
    return config, run_preflight(config, presets=["dflash", "ar", "ddtree"])


@pytest.mark.slow
@needs_sglang
def test_sglang_accepts_a_good_dflash_command(upstream_findings):
    _, findings = upstream_findings
    assert [f for f in _errors(findings) if f.preset != "ddtree"] == [], [f.render() for f in findings]


@pytest.mark.slow
@needs_sglang
def test_sglang_catches_a_misspelled_dflash_flag_by_point(tmp_path):
    config = _with_typo(_real_config(tmp_path, engine={"launcher": [sys.executable, "-m", "sglang.launch_server"]}),
                        "dflash", "--speculative-dflash-block-size", "--speculative-dflash-blok-size")
    errors = _errors(run_preflight(config, presets=["dflash"]))
    assert len(errors) == 1
    assert errors[0].preset == "dflash" and errors[0].points == ("dflash-bs8-w2048",)
    assert errors[0].message.startswith("SGLang (")
    assert "did you mean --speculative-dflash-block-size?" in errors[0].message


@pytest.mark.slow
@needs_sglang
def test_upstream_sglang_has_no_ddtree_flags(upstream_findings):
    config, findings = upstream_findings
    errors = [f for f in _errors(findings) if f.preset == "ddtree"]
    flags = [e for e in errors if "does not accept the flag" in e.message]
    assert [e.message.rsplit(" ", 1)[-1] for e in flags] == ["--speculative-ddtree-budget"]
    assert len(flags[0].points) == len([p for p in expand_points(config) if p.preset == "ddtree"])
    # and the build check says that this SGLang is none of the DDTree builds the library knows
    [build] = [e for e in errors if e not in flags]
    assert "matches no build of the preset library" in build.message
