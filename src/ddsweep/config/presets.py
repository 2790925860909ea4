"""The preset library: one YAML file per engine build in config/presets/, merged under a study's own presets.

A file names its build (`build.name`, and the argument-parser options that tell it apart from other builds:
`options_present`, `options_absent`) and holds that build's presets. A study's `engine.presets` adds presets
or replaces a library preset of the same name. `engine.failure_patterns` apply to every preset; a preset's own
patterns add to them."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ddsweep.config.knobs import FUNCTIONS, KIND_KNOBS, compile_expression, evaluate


class PresetLibraryError(ValueError):
    """A library file that cannot be read or has a malformed build or preset section; names the file."""


@dataclass(frozen=True)
class Build:
    """An engine build and the options its argument parser has (present) and lacks (absent)."""

    name: str
    description: str
    options_present: tuple[str, ...] = ()
    options_absent: tuple[str, ...] = ()

    @property
    def detectable(self) -> bool:
        """Whether the build can be recognised from a parser's options."""
        return bool(self.options_present or self.options_absent)

    def matches(self, options: Iterable[str]) -> bool:
        """Whether a parser with these option strings is this build."""
        known = set(options)
        return all(o in known for o in self.options_present) and not any(o in known for o in self.options_absent)


def library_dir() -> Path:
    """The folder of preset files shipped with ddsweep (config/presets/ in the repository)."""
    return Path(str(resources.files("ddsweep.config") / "presets"))


@functools.lru_cache(maxsize=4)
def _read_library(folder: str) -> tuple[dict[str, Build], dict[str, dict]]:
    """Builds by name and presets by name (each tagged with its build) from every *.yaml file of `folder`."""
    builds: dict[str, Build] = {}
    presets: dict[str, dict] = {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            data = yaml.load(path.read_text(), Loader=loader) or {}
        except yaml.YAMLError as exc:
            raise PresetLibraryError(f"{path}: not valid YAML: {exc}") from exc
        build = data.get("build") or {}
        if not isinstance(build, Mapping) or not build.get("name") or not isinstance(data.get("presets"), Mapping):
            raise PresetLibraryError(f"{path}: a preset file needs build.name and a presets mapping")
        builds[build["name"]] = Build(build["name"], str(build.get("description", "")),
                                      tuple(build.get("options_present", [])), tuple(build.get("options_absent", [])))
        for name, preset in data["presets"].items():
            if name in presets:
                raise PresetLibraryError(f"{path}: preset {name!r} is also defined in build {presets[name]['build']}")
            presets[name] = {**preset, "build": build["name"]}
    return builds, presets


def library_builds(folder: Path | None = None) -> dict[str, Build]:
    """Every build the library describes, by name."""
    return _read_library(str(folder or library_dir()))[0]


def library_presets(folder: Path | None = None) -> dict[str, dict]:
    """A fresh copy of every library preset, by name (each with its `build`)."""
    return copy.deepcopy(_read_library(str(folder or library_dir()))[1])


def _union(first: list[str], second: list[str]) -> list[str]:
    """The patterns of both lists, each once, in order."""
    return list(dict.fromkeys([*first, *second]))


def with_library(config: dict, folder: Path | None = None) -> dict:
    """`config` (in place) with the library's presets under its own and the default failure patterns in each."""
    engine = config.setdefault("engine", {})
    presets = library_presets(folder)
    presets.update(engine.get("presets") or {})
    defaults = engine.get("failure_patterns") or {}
    for preset in presets.values():
        own = preset.get("failure_patterns") or {}
        preset["failure_patterns"] = {cls: _union(list(defaults.get(cls, [])), list(own.get(cls, [])))
                                      for cls in ("infrastructure", "configuration")}
    engine["presets"] = presets
    return config


def derived_values(preset: Mapping[str, Any], knobs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The preset's derived placeholders for these knobs (None where a knob they use is None)."""
    names = KIND_KNOBS[preset["kind"]]
    values = {k: knobs.get(k) for k in names}
    out: dict[str, Any] = {}
    for name, expression in (preset.get("derived") or {}).items():
        code = compile_expression(str(expression), f"{where}.derived.{name}", names, tuple(FUNCTIONS))
        try:
            out[name] = evaluate(code, values)
        except TypeError:
            out[name] = None
    return out
