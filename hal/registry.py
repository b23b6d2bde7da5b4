"""Backend discovery and selection.

Selection is a pure function of (spec, caps, the discovered backends): every candidate ends
accepted or rejected with reasons a user can read, and the winner is the accepted backend of highest
rank. Only then is the winner built; a winner whose build fails is recorded as rejected and the next
one is built instead."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from importlib import metadata
from typing import Optional

import attrs

from hal.backend import Backend, Target
from hal.caps import Caps
from hal.spec import MoESpec, RequantSpec
from hal.verdict import Verdict

log = logging.getLogger("hal.registry")

ENTRY_POINT_GROUP = "hal.backends"
OPS = {MoESpec: "moe", RequantSpec: "requant"}


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

    def line(self, winner: bool) -> str:
        mark = "WIN " if winner else ("ok  " if self.verdict.ok else "no  ")
        rank = f" rank {self.rank}" if self.rank is not None else ""
        return f"  {mark}{self.name}{rank}: {self.verdict.summary()}"


@attrs.frozen
class Decision:
    op: str
    spec: object
    device: str
    caps_origin: str
    candidates: tuple
    winner: Optional[str]
    forced_by: Optional[str] = None  # "prefer=" or "HAL_MOE_BACKEND"

    def explain(self) -> str:
        forced = f", forced by {self.forced_by}" if self.forced_by else ""
        lines = [f"op {self.op} on {self.device} ({self.caps_origin}){forced}", f"  spec: {self.spec}"]
        order = sorted(self.candidates, key=lambda c: (c.name != self.winner, not c.verdict.ok,
                                                       -(c.rank or 0), c.name))
        lines += [c.line(c.name == self.winner) for c in order]
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
            "spec": attrs.asdict(self.spec),
            "candidates": [{"name": c.name, "ok": c.verdict.ok, "rank": c.rank,
                            "reasons": list(c.verdict.reasons), "notes": list(c.verdict.notes)}
                           for c in self.candidates],
        }


def _env_list(name: str) -> Optional[set]:
    raw = os.environ.get(name, "").strip()
    return {item.strip() for item in raw.split(",") if item.strip()} if raw else None


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


def _candidate(found: Discovered, op: str, spec, target: Target) -> Candidate:
    if found.backend is None:
        return Candidate(found.name, Verdict.reject(found.error))
    backend = found.backend
    if op not in backend.ops:
        return Candidate(found.name, Verdict.reject(f"does not serve op {op!r}"))
    try:
        verdict = backend.check(spec, target)
        rank = backend.rank(spec, target) if verdict.ok else None
    except Exception as exc:  # a buggy backend is rejected, not fatal
        return Candidate(found.name, Verdict.reject(f"check raised {type(exc).__name__}: {exc}"))
    return Candidate(found.name, verdict, rank)


def decide(spec, target: Target, found: Iterable[Discovered], prefer: Optional[str] = None) -> Decision:
    """The pure part of selection: every candidate's verdict and the winner's name."""
    op = OPS.get(type(spec))
    if op is None:
        raise ValueError(f"spec must be hal.MoESpec or hal.RequantSpec, got {type(spec).__name__}")
    allow, deny = _env_list("HAL_BACKENDS"), _env_list("HAL_DISABLE_BACKENDS")
    forced_by = "prefer=" if prefer else None
    if not prefer and os.environ.get("HAL_MOE_BACKEND", "").strip():
        prefer, forced_by = os.environ["HAL_MOE_BACKEND"].strip(), "HAL_MOE_BACKEND"
    candidates = []
    for item in found:
        if allow is not None and item.name not in allow:
            candidates.append(Candidate(item.name, Verdict.reject("not in HAL_BACKENDS")))
        elif deny is not None and item.name in deny:
            candidates.append(Candidate(item.name, Verdict.reject("listed in HAL_DISABLE_BACKENDS")))
        elif prefer and item.name != prefer:
            candidates.append(Candidate(item.name, Verdict.reject(f"{forced_by} names {prefer!r}")))
        else:
            candidates.append(_candidate(item, op, spec, target))
    return Decision(op, spec, target.device, target.caps.profile or "probed", tuple(candidates),
                    _winner(candidates), forced_by)


def _winner(candidates) -> Optional[str]:
    """The accepted candidate of highest rank, or None."""
    accepted = [c for c in candidates if c.verdict.ok]
    return max(accepted, key=lambda c: c.rank).name if accepted else None


def _resolve_caps(caps: Optional[Caps], device: str) -> Caps:
    if caps is not None:
        return caps
    from hal.probe import probe

    # Creating a GPU context is fine here: the caller is about to run on that GPU.
    return probe(deep=device != "cpu")


def select_kernel(spec, device="cpu", *, caps: Optional[Caps] = None, prefer: Optional[str] = None,
                  backends: Optional[Iterable[Discovered]] = None):
    """Pick and build the best kernel for `spec` on `device`. `caps` defaults to probing this
    machine; `backends` defaults to the entry points (tests pass their own)."""
    device = normalize_device(device)
    target = Target(device, _resolve_caps(caps, device))
    found = list(discover() if backends is None else backends)
    decision = decide(spec, target, found, prefer)
    if decision.forced_by and decision.winner is None:
        raise NoKernelError(decision, f"backend {prefer or os.environ.get('HAL_MOE_BACKEND')!r} "
                                      f"({decision.forced_by}) cannot run this spec")
    by_name = {item.name: item.backend for item in found}
    while decision.winner is not None:
        try:
            kernel = by_name[decision.winner].build(spec, target)
        except Exception as exc:
            failed = decision.winner
            log.warning("backend %s failed to build: %s", failed, exc)
            candidates = tuple(
                Candidate(c.name, Verdict.reject(f"build failed: {type(exc).__name__}: {exc}"))
                if c.name == failed else c for c in decision.candidates)
            decision = attrs.evolve(decision, candidates=candidates, winner=_winner(candidates))
            continue
        kernel.decision = decision
        winner = next(c for c in decision.candidates if c.name == decision.winner)
        log.info("%s on %s: %s (%s)", decision.op, device, decision.winner, winner.verdict.summary())
        for c in decision.candidates:
            if not c.verdict.ok:
                log.debug("%s rejected: %s", c.name, c.verdict.summary())
        return kernel
    raise NoKernelError(decision, f"no backend can run {decision.op} for this spec on {device}")


def select_moe_kernel(spec: MoESpec, device="cpu", *, caps: Optional[Caps] = None,
                      prefer: Optional[str] = None, backends=None, group=None):
    if not isinstance(spec, MoESpec):
        raise ValueError(f"spec must be hal.MoESpec, got {type(spec).__name__}")
    if group is not None:  # expert parallelism over a torch.distributed group: hal/distributed
        from hal.distributed import select_ep_kernel
        return select_ep_kernel(spec, device, group, caps=caps, prefer=prefer, backends=backends)
    return select_kernel(spec, device, caps=caps, prefer=prefer, backends=backends)


def select_requant_kernel(spec: RequantSpec, device="cuda", *, caps: Optional[Caps] = None,
                          prefer: Optional[str] = None, backends=None):
    if not isinstance(spec, RequantSpec):
        raise ValueError(f"spec must be hal.RequantSpec, got {type(spec).__name__}")
    return select_kernel(spec, device, caps=caps, prefer=prefer, backends=backends)
