"""Recorded capability snapshots: hal/profiles/<name>.json, or any file named by HAL_CAPS.

Selection is a pure function of the caps, so a profile lets every machine test the decisions made
for every other one."""

from __future__ import annotations

from pathlib import Path

import attrs

from hal.caps import Caps

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
HAL_CAPS_VARIABLE = "HAL_CAPS"


def list_profiles() -> list:
    """Names of the recorded profiles, sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name: str) -> Caps:
    """A recorded profile by name (see list_profiles()), or a path to a caps JSON file."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"profile={name!r}: expected a profile name or a path to a caps JSON file")
    recorded = PROFILE_DIR / f"{name}.json"
    if recorded.is_file():
        return _read(recorded, name)
    path = Path(name).expanduser()
    if path.suffix == ".json" and path.is_file():
        return _read(path, None)
    raise ValueError(f"profile={name!r}: no such profile; expected one of {', '.join(list_profiles())} "
                     "or a path to a caps .json file")


def _read(path: Path, name) -> Caps:
    try:
        caps = Caps.from_json(path.read_text())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"profile file {path}: {exc}") from exc
    except RecursionError:  # json nests deeper than the interpreter's stack
        raise ValueError(f"profile file {path}: nested too deeply to be a caps file") from None
    return attrs.evolve(caps, profile=name or caps.profile or path.stem)


def load_hal_caps(value: str) -> Caps:
    """The caps HAL_CAPS names: a file path or a recorded profile name."""
    try:
        return load_profile(value)
    except ValueError as exc:
        raise ValueError(f"{HAL_CAPS_VARIABLE}={value!r}: {exc}") from exc
