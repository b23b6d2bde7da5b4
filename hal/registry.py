"""Backend discovery and selection.

Selection is a pure function of (spec, caps, the discovered backends, the environment); it builds
nothing and probes nothing. The rule, in order:

1. The op is the spec's (hal.ops.op_of): "moe", "moe_masked" or "requant".
2. HAL_BACKENDS (allow-list) and HAL_DISABLE_BACKENDS (deny-list) apply to every op. A forced
   backend, from `prefer=` or else the op's own override variable (HAL_MOE_BACKEND,
   HAL_MOE_MASKED_BACKEND, HAL_REQUANT_BACKEND), rejects every other backend for that op only.
3. Every remaining backend that serves the op answers check(spec, target) with a Verdict, and
   rank(spec, target) when it accepts. A backend that raises is rejected with the exception.
4. The winner is the accepted backend of highest rank. An accepted verdict marked explicit_only
   never wins unless its backend is forced. Equal ranks fall to the backend's declared `priority`
   (an int attribute, default 0; higher wins), then to the name in alphabetical order, so the
   result never depends on the order entry points are discovered in.

select_kernel() decides on a target whose live facts hal.live has refined (recorded profiles are
taken as recorded), then builds the winner. A build that
fails (no compiler, no nvcc, a broken Triton) is recorded as that backend's rejection, with the
error, and the next backend by the same rule is built instead.

A winner in the reference band (RANK_REFERENCE) that nobody forced is the slow path: correct, and
far slower than any compiled kernel. Selection warns once per spec and device (SlowPathWarning),
naming why every faster backend lost; in strict mode (strict=True or HAL_STRICT=1) it raises
NoKernelError instead."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterable
from importlib import metadata
from typing import Optional

import attrs

from hal import ops
from hal.backend import RANK_REFERENCE, Backend, Target, checked
from hal.caps import Caps
from hal.live import refine
from hal.spec import MoESpec, RequantSpec
from hal.verdict import Verdict

log = logging.getLogger("hal.registry")

ENTRY_POINT_GROUP = "hal.backends"
GLOBAL_VARIABLES = ("HAL_BACKENDS", "HAL_DISABLE_BACKENDS")
STRICT_VARIABLE = "HAL_STRICT"
_HAL_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class SlowPathWarning(UserWarning):
    """Selection fell to the reference oracle because no faster backend can run the spec here."""


class NoKernelError(RuntimeError):
    """No backend can run the spec here; the message lists every backend's reasons."""

    def __init__(self, decision: Decision, headline: str):
        self.decision = decision
        super().__init__(f"{headline}\n{decision.explain()}")


@attrs.frozen
class Discovered:
    """One entry point: the backend object, or why it could not be loaded."""

    name: str
    backend: Optional[object] = None
    error: Optional[str] = None


@attrs.frozen
class Candidate:
    name: str
    verdict: Verdict
    rank: Optional[int] = None
    priority: int = 0
    forced: bool = False  # named by prefer= or the op's override variable
    serves: bool = True  # the backend declares the op

    @property
    def eligible(self) -> bool:
        """May win: accepted, and either auto-selectable or forced."""
        return self.verdict.ok and (self.forced or not self.verdict.explicit_only)

    def order_key(self) -> tuple:
        """Sorts the winner first: rank, then priority (both higher first), then name."""
        return (-(self.rank or 0), -self.priority, self.name)

    def line(self, winner: bool, override_variable: str) -> str:
        if winner:
            mark = "WIN"
        elif self.verdict.ok and not self.eligible:
            mark = "only"
        else:
            mark = "ok " if self.verdict.ok else "no "
        rank = f" rank {self.rank}" if self.rank is not None else ""
        priority = f" priority {self.priority}" if self.priority else ""
        explicit = (f" [explicit only: runs when named by prefer= or {override_variable}]"
                    if self.verdict.ok and self.verdict.explicit_only else "")
        return f"  {mark} {self.name}{rank}{priority}: {self.verdict.summary()}{explicit}"


@attrs.frozen
class Decision:
    op: str
    spec: object
    device: str
    caps_origin: str
    candidates: tuple
    winner: Optional[str]
    forced_by: Optional[str] = None  # "prefer=" or the op's override variable
    forced: Optional[str] = None  # the backend named

    @property
    def slow(self) -> bool:
        """The winner is in the reference band and nobody forced it: nothing faster can run."""
        winner = next((c for c in self.candidates if c.name == self.winner), None)
        return winner is not None and not winner.forced and (winner.rank or 0) <= RANK_REFERENCE

    def losers(self) -> str:
        """Why every other backend that serves the op lost, on one line."""
        return "; ".join(f"{c.name}: {'runs only when forced: ' if c.verdict.ok else ''}"
                         f"{c.verdict.summary()}" for c in sorted(self.candidates, key=lambda c: c.name)
                         if c.name != self.winner and c.serves) or "no other backend serves the op"

    def explain(self) -> str:
        forced = f", {self.forced!r} forced by {self.forced_by}" if self.forced_by else ""
        variable = ops.get(self.op).override_variable
        lines = [f"op {self.op} on {self.device} ({self.caps_origin}){forced}", f"  spec: {self.spec}"]
        order = sorted(self.candidates, key=lambda c: (c.name != self.winner, not c.eligible,
                                                       not c.verdict.ok, c.order_key()))
        lines += [c.line(c.name == self.winner, variable) for c in order]
        if self.slow:
            lines[2] += "  [SLOW PATH]"
            lines.append(f"  SLOW PATH: {self.winner} is the reference oracle, far slower than a compiled "
                         f"kernel; no faster backend can run this spec here ({STRICT_VARIABLE}=1 makes "
                         "this an error)")
        if not self.candidates:
            lines.append(f"  no backend is registered under the {ENTRY_POINT_GROUP!r} entry points: "
                         "install the package (pip install -e .) so its metadata lists them")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "device": self.device,
            "caps": self.caps_origin,
            "winner": self.winner,
            "forced_by": self.forced_by,
            "forced": self.forced,
            "slow_path": self.slow,
            "spec": attrs.asdict(self.spec),
            "candidates": [{"name": c.name, "ok": c.verdict.ok, "rank": c.rank, "priority": c.priority,
                            "explicit_only": c.verdict.explicit_only, "eligible": c.eligible,
                            "reasons": list(c.verdict.reasons), "notes": list(c.verdict.notes)}
                           for c in self.candidates],
        }


def _env_list(name: str) -> Optional[set]:
    raw = os.environ.get(name, "").strip()
    return {item.strip() for item in raw.split(",") if item.strip()} if raw else None


def _check_names(names, variable: str, known: set) -> None:
    """A ValueError naming `variable` when it names a backend that is not registered."""
    unknown = sorted(set(names or ()) - known)
    if unknown:
        raise ValueError(f"{variable} names {', '.join(map(repr, unknown))}, not a registered backend: "
                         f"known backends are {', '.join(sorted(known)) or '(none)'}")


def strict_from_env() -> bool:
    """HAL_STRICT: 1 refuses the slow path everywhere, 0 or unset allows it with a warning."""
    raw = os.environ.get(STRICT_VARIABLE, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{STRICT_VARIABLE}={raw!r}: expected 1 (refuse the reference oracle as a "
                     "fallback) or 0")


def discover() -> list:
    """Load every backend registered under the "hal.backends" entry-point group. A backend whose
    import fails is returned with the error, never raised."""
    found = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
        except Exception as exc:  # a missing Triton or CUDA must not break selection
            found.append(Discovered(ep.name, error=f"import failed: {type(exc).__name__}: {exc}"))
            continue
        if not isinstance(obj, Backend):
            found.append(Discovered(ep.name, error=f"{ep.value} is not a backend (needs name, ops, "
                                                   "check, rank, build)"))
            continue
        found.append(Discovered(obj.name, backend=obj))
    return found


def normalize_device(device) -> str:
    text = str(device).strip().lower()
    if text == "cpu":
        return "cpu"
    if text == "cuda":
        return "cuda:0"
    if text.startswith("cuda:") and text[5:].isdigit():
        return text
    raise ValueError(f"device={device!r} is not allowed: expected 'cpu', 'cuda' or 'cuda:N'")


def _candidate(found: Discovered, op: ops.Op, spec, target: Target, forced: bool) -> Candidate:
    if found.backend is None:
        return Candidate(found.name, Verdict.reject(found.error), forced=forced)
    backend = found.backend
    if op.name not in backend.ops:
        return Candidate(found.name, Verdict.reject(f"does not serve op {op.name!r}"), forced=forced,
                         serves=False)
    priority = getattr(backend, "priority", 0)
    try:
        verdict = checked(backend, spec, target)
        rank = backend.rank(spec, target) if verdict.ok else None
    except Exception as exc:  # a buggy backend is rejected, not fatal
        return Candidate(found.name, Verdict.reject(f"check raised {type(exc).__name__}: {exc}"),
                         priority=priority, forced=forced)
    return Candidate(found.name, verdict, rank, priority, forced)


def forced_backend(op: ops.Op, prefer: Optional[str]) -> tuple:
    """(backend name, what forced it) or (None, None): prefer= wins over the op's variable."""
    if prefer:
        return prefer, "prefer="
    named = os.environ.get(op.override_variable, "").strip()
    return (named, op.override_variable) if named else (None, None)


def decide(spec, target: Target, found: Iterable[Discovered], prefer: Optional[str] = None) -> Decision:
    """The pure part of selection: every candidate's verdict and the winner's name."""
    op = ops.op_of(spec)
    found = list(found)
    known = {item.name for item in found}
    allow, deny = _env_list("HAL_BACKENDS"), _env_list("HAL_DISABLE_BACKENDS")
    _check_names(allow, "HAL_BACKENDS", known)
    _check_names(deny, "HAL_DISABLE_BACKENDS", known)
    for each in ops.OPS:
        _check_names(_env_list(each.override_variable), each.override_variable, known)
    forced, forced_by = forced_backend(op, prefer)
    candidates = []
    for item in found:
        if allow is not None and item.name not in allow:
            candidates.append(Candidate(item.name, Verdict.reject("not in HAL_BACKENDS")))
        elif deny is not None and item.name in deny:
            candidates.append(Candidate(item.name, Verdict.reject("listed in HAL_DISABLE_BACKENDS")))
        elif forced and item.name != forced:
            candidates.append(Candidate(item.name, Verdict.reject(f"{forced_by} names {forced!r}")))
        else:
            candidates.append(_candidate(item, op, spec, target, forced=bool(forced)))
    return Decision(op.name, spec, target.device, target.caps.profile or "probed", tuple(candidates),
                    _winner(candidates), forced_by, forced)


def _winner(candidates) -> Optional[str]:
    """The eligible candidate first by (rank, priority, name), or None."""
    eligible = [c for c in candidates if c.eligible]
    return min(eligible, key=Candidate.order_key).name if eligible else None


def _resolve_caps(caps: Optional[Caps], device: str) -> Caps:
    """The caps to decide on: `caps`, else this machine's (whose `device` must exist) or HAL_CAPS's.
    A GPU device must be among the GPUs the caps list."""
    if caps is None:
        from hal.probe import probe
        from hal.probe.profiles import HAL_CAPS_VARIABLE

        if not os.environ.get(HAL_CAPS_VARIABLE):
            from hal.devices import require_device

            require_device(device)
        # Creating a GPU context is fine here: the caller is about to run on that GPU.
        caps = probe(deep=device != "cpu")
    if device != "cpu":
        index = int(device.partition(":")[2])
        if not any(gpu.index == index for gpu in caps.gpus):
            listed = ", ".join(f"cuda:{gpu.index}" for gpu in caps.gpus) or "none"
            raise ValueError(f"device={device!r}: the capabilities ({caps.profile or 'probed'}) list no "
                             f"GPU at index {index} (GPUs listed: {listed})")
    return caps


def _warn_slow_path(decision: Decision) -> None:
    """One SlowPathWarning per spec and device, pointed at the caller's line outside hal."""
    key = (decision.spec, decision.device)
    if key in _slow_path_warned:
        return
    _slow_path_warned.add(key)
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(_HAL_DIR):
        level, frame = level + 1, frame.f_back
    warnings.warn(f"{decision.op} on {decision.device} takes the slow path: {decision.winner}, the "
                  f"reference oracle, runs {decision.spec} because no faster backend can: "
                  f"{decision.losers()}. Pass prefer={decision.winner!r} to choose it knowingly, or "
                  f"strict=True ({STRICT_VARIABLE}=1) to make this an error.",
                  SlowPathWarning, stacklevel=level)


_slow_path_warned: set = set()  # (spec, device) already warned about in this process


def select_kernel(spec, device="cpu", *, caps: Optional[Caps] = None, prefer: Optional[str] = None,
                  backends: Optional[Iterable[Discovered]] = None, strict: Optional[bool] = None):
    """Pick and build the best kernel for `spec` on `device`, whatever its op. `caps` defaults to
    probing this machine; `backends` defaults to the entry points (tests pass their own). `strict`
    (default: HAL_STRICT) raises NoKernelError where only the reference oracle can run the spec;
    otherwise that slow path is taken with a SlowPathWarning."""
    device = normalize_device(device)
    op = ops.op_of(spec)
    strict_arg = strict
    if strict is None:
        strict = strict_from_env()
    elif not isinstance(strict, bool):
        raise ValueError(f"strict={strict!r}: expected True, False or None ({STRICT_VARIABLE})")
    target = refine(Target(device, _resolve_caps(caps, device)))
    found = list(discover() if backends is None else backends)
    decision = decide(spec, target, found, prefer)
    if decision.forced_by and decision.winner is None:
        names = sorted(item.name for item in found)
        why = ("cannot run this spec" if decision.forced in names else
               f"is not a registered backend: known backends are {', '.join(names) or '(none)'}")
        raise NoKernelError(decision, f"backend {decision.forced!r} ({decision.forced_by}) {why}")
    by_name = {item.name: item.backend for item in found}
    while decision.winner is not None:
        if strict and decision.slow:
            how = "strict=True" if strict_arg else f"{STRICT_VARIABLE}=1"
            raise NoKernelError(attrs.evolve(decision, winner=None),
                                f"no fast backend can run {op.name} for this spec on {device}, and {how} "
                                f"refuses the reference oracle")
        try:
            kernel = by_name[decision.winner].build(spec, target)
        except Exception as exc:
            failed = decision.winner
            log.warning("backend %s failed to build: %s", failed, exc)
            candidates = tuple(
                attrs.evolve(c, verdict=Verdict.reject(f"build failed: {type(exc).__name__}: {exc}"),
                             rank=None)
                if c.name == failed else c for c in decision.candidates)
            decision = attrs.evolve(decision, candidates=candidates, winner=_winner(candidates))
            continue
        kernel.decision = decision
        if decision.slow:
            _warn_slow_path(decision)
        winner = next(c for c in decision.candidates if c.name == decision.winner)
        log.info("%s on %s: %s (%s)", decision.op, device, decision.winner, winner.verdict.summary())
        for c in decision.candidates:
            if not c.verdict.ok:
                log.debug("%s rejected: %s", c.name, c.verdict.summary())
        return kernel
    raise NoKernelError(decision, f"no backend can run {op.name} for this spec on {device}")


def select_moe_kernel(spec: MoESpec, device="cpu", *, caps: Optional[Caps] = None,
                      prefer: Optional[str] = None, backends=None, group=None,
                      strict: Optional[bool] = None):
    """Op "moe" (layout="tokens") or "moe_masked" (layout="masked"), as the spec's layout says.
    With `group` (a torch.distributed process group), an expert-parallel kernel over its ranks."""
    if not isinstance(spec, MoESpec):
        raise ValueError(f"spec must be hal.MoESpec, got {type(spec).__name__}")
    if group is not None:  # expert parallelism over a torch.distributed group: hal/distributed
        from hal.distributed import select_ep_kernel
        return select_ep_kernel(spec, device, group, caps=caps, prefer=prefer, backends=backends,
                                strict=strict)
    return select_kernel(spec, device, caps=caps, prefer=prefer, backends=backends, strict=strict)


def select_requant_kernel(spec: RequantSpec, device="cuda", *, caps: Optional[Caps] = None,
                          prefer: Optional[str] = None, backends=None, strict: Optional[bool] = None):
    """Op "requant"."""
    if not isinstance(spec, RequantSpec):
        raise ValueError(f"spec must be hal.RequantSpec, got {type(spec).__name__}")
    return select_kernel(spec, device, caps=caps, prefer=prefer, backends=backends, strict=strict)
