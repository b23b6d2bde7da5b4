"""Fuzz of the validation contract: random invalid specs, weights and call arguments must each raise
a ValueError whose message names the offending argument; random valid ones must match the float64
oracle. Nothing may crash, so the loop runs in a child Python and reports each case before it runs:

    python -m hal.testing.fuzz --seed 7 --invalid 1000 --valid 200 [--device cuda:0]

prints one JSON line per case ({"case": i, "what": ...}) and a last line {"summary": ...}."""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time

import attrs
import torch

from hal.backend import checked
from hal.spec import MoESpec, RequantSpec
from hal.testing import harness
from hal.testing.accuracy import ACCURACY, rel_err
from hal.testing.cases import MASKED_SPECS, MOE_SPECS, REQUANT_SPECS, Case, caps_for, op_of, serves

TOKEN_BASES = ("bf16-silu", "fp8-swiglu-bias-ep", "mxfp4-silu-ep", "int4-silu")  # int4: Marlin on GPUs


def names_argument(message: str, arg: str) -> bool:
    """The message names `arg` as a word (so "x" is not found inside "x_scale" or "expected")."""
    return re.search(rf"(?<![\w]){re.escape(arg)}(?![\w])", message) is not None


@attrs.frozen
class Invalid:
    what: str  # the mutation, in words
    arg: str  # the argument the ValueError must name
    call: object  # () -> anything; must raise ValueError


class Pool:
    """Kernels, weights and inputs of every backend that runs the base specs on this device,
    built once and shared by all cases."""

    def __init__(self, device: str, interpreted_ok: bool):
        self.device = device
        caps = caps_for(device)
        self.cases = {"moe": [], "moe_masked": [], "requant": []}
        bases = {**{k: MOE_SPECS[k] for k in TOKEN_BASES}, **MASKED_SPECS, **REQUANT_SPECS}
        from hal.backend import Target

        target = Target(device, caps)
        for found in harness.discovered():
            if found.backend is None:
                continue
            for spec_id, spec in bases.items():
                if not serves(found.backend, spec):  # the registry asks only a backend of the op
                    continue
                verdict = checked(found.backend, spec, target)
                if verdict.ok:
                    case = Case(found.name, device, spec_id, spec, caps, verdict.notes)
                    if interpreted_ok or not case.interpreted:
                        self.cases[op_of(spec)].append(case)
        self.backends = sorted({c.backend for cases in self.cases.values() for c in cases})


def _spec_mutations(rng: random.Random) -> list:
    base = dict(num_experts=8, top_k=2, hidden_size=128, intermediate_size=256)
    bad_int = rng.choice([0, -rng.randint(1, 1000), 2.5, True, "8", None])
    out = [
        (f"MoESpec num_experts={bad_int!r}", "num_experts", dict(num_experts=bad_int)),
        (f"MoESpec top_k={bad_int!r}", "top_k", dict(top_k=bad_int)),
        (f"MoESpec hidden_size={bad_int!r}", "hidden_size", dict(hidden_size=bad_int)),
        (f"MoESpec intermediate_size={bad_int!r}", "intermediate_size", dict(intermediate_size=bad_int)),
        ("MoESpec top_k > num_experts", "top_k", dict(num_experts=4, top_k=rng.randint(5, 64))),
        ("MoESpec unknown weight_format", "weight_format", dict(weight_format=rng.choice(
            ["fp4", "int8", "", "BF16", None]))),
        ("MoESpec unknown activation", "activation", dict(activation=rng.choice(["gelu", "SiLU", "", 1]))),
        ("MoESpec unknown layout", "layout", dict(layout=rng.choice(["blocked", "", None]))),
        ("MoESpec unknown act_dtype", "act_dtype", dict(act_dtype=rng.choice(["float32", "bf16", None]))),
        ("MoESpec has_bias not a bool", "has_bias", dict(has_bias=rng.choice([1, "yes", None]))),
        ("MoESpec num_local_experts out of range", "num_local_experts",
         dict(num_local_experts=rng.choice([0, -1, 9, 100, 2.0, True]))),
        ("MoESpec group_size not 128 or -1", "group_size",
         dict(weight_format="int4_g128", group_size=rng.choice([0, 64, 32, 256, -2]))),
        ("MoESpec group_size -1 for a non-int4 format", "group_size",
         dict(weight_format=rng.choice(["bf16", "mxfp4", "fp8_block128"]), group_size=-1)),
        ("MoESpec hidden_size not a multiple of the format's unit", "hidden_size",
         dict(weight_format=rng.choice(["mxfp4", "int4_g128"]), hidden_size=rng.choice([48, 100, 130]))),
        ("MoESpec swiglu_limit <= 0", "swiglu_limit",
         dict(activation="swiglu_oai", swiglu_limit=rng.choice([0.0, -1.0, float("nan")]))),
        ("MoESpec swiglu_alpha not finite", "swiglu_alpha",
         dict(activation="swiglu_oai", swiglu_alpha=rng.choice([float("nan"), float("inf"), "x"]))),
        ("MoESpec w4afp8 on the token layout", "layout", dict(weight_format="w4afp8")),
        ("MoESpec masked layout for bf16", "layout", dict(layout="masked")),
        ("MoESpec w4afp8 with bias", "has_bias",
         dict(weight_format="w4afp8", layout="masked", has_bias=True)),
    ]
    what, arg, change = rng.choice(out)
    return [Invalid(what, arg, lambda: MoESpec(**{**base, **change}))]


def _requant_spec_mutations(rng: random.Random) -> list:
    choices = [
        ("RequantSpec num_experts <= 0", "num_experts", dict(num_experts=rng.choice([0, -4]))),
        ("RequantSpec hidden_size not a multiple of 128", "hidden_size",
         dict(hidden_size=rng.choice([100, 129, 64]))),
        ("RequantSpec hidden_size <= 0", "hidden_size", dict(hidden_size=rng.choice([0, -128]))),
        ("RequantSpec group_size not 128", "group_size", dict(group_size=rng.choice([64, 0, -1]))),
    ]
    what, arg, change = rng.choice(choices)
    return [Invalid(what, arg, lambda: RequantSpec(**{"num_experts": 4, "hidden_size": 256, **change}))]


def _non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same shape and values with a stride of 2 along the last dimension."""
    view = torch.stack([t, t], dim=-1)[..., 0]
    assert not view.is_contiguous(), "a tensor of one element cannot be made non-contiguous"
    return view


def _token_mutations(rng: random.Random, pool: Pool) -> list:
    case = rng.choice(pool.cases["moe"])
    b = harness.built(case)
    spec = case.spec
    M = rng.randint(1, 9)
    x, tw, ti = harness.token_inputs(spec, M, case.device, seed=rng.randint(0, 1 << 30))
    other = next((c for c in pool.cases["moe"] if c.spec != spec), None)
    prepared_other = harness.built(other).prepared if other is not None else None
    E, k, H = spec.num_experts, spec.top_k, spec.hidden_size
    bad_id = rng.choice([E, E + rng.randint(1, 1000), -2, -rng.randint(3, 1 << 20), 1 << 30])
    bad_ids = ti.clone()
    bad_ids[rng.randrange(M), rng.randrange(k)] = bad_id
    wrong_float = rng.choice([torch.float32, torch.float64, torch.float16])
    if wrong_float == getattr(torch, spec.act_dtype):
        wrong_float = torch.float64
    meta = lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")  # noqa: E731
    choices = [
        ("x dtype", "x", dict(x=x.to(wrong_float))),
        ("x hidden size", "x", dict(x=torch.randn(M, H + rng.choice([-1, 1, 32])).to(x.dtype))),
        ("x 1-D", "x", dict(x=x[0])),
        ("x 3-D", "x", dict(x=x.unsqueeze(0))),
        ("x non-contiguous", "x", dict(x=_non_contiguous(x))),
        ("x not a tensor", "x", dict(x=x.tolist())),
        ("x on another device", "x", dict(x=meta(x))),
        ("topk_ids float", "topk_ids", dict(ti=ti.float())),
        ("topk_ids int16", "topk_ids", dict(ti=ti.to(torch.int16))),
        ("topk_ids wrong top_k", "topk_ids", dict(ti=torch.cat([ti, ti[:, :1]], dim=1))),
        ("topk_ids wrong rows", "topk_ids", dict(ti=ti[: M - 1] if M > 1 else torch.cat([ti, ti]))),
        (f"topk_ids holds {bad_id}", "topk_ids", dict(ti=bad_ids)),
        ("topk_ids non-contiguous", "topk_ids", dict(ti=_non_contiguous(ti))),
        ("topk_ids not a tensor", "topk_ids", dict(ti=ti.tolist())),
        ("topk_ids on another device", "topk_ids", dict(ti=meta(ti))),
        ("topk_weights float64", "topk_weights", dict(tw=tw.double())),
        ("topk_weights wrong shape", "topk_weights", dict(tw=tw[:, :1] if k > 1 else tw.repeat(1, 2))),
        ("topk_weights non-contiguous", "topk_weights", dict(tw=_non_contiguous(tw))),
        ("topk_weights not a tensor", "topk_weights", dict(tw=None)),
        ("topk_weights on another device", "topk_weights", dict(tw=meta(tw))),
        ("out dtype", "out", dict(out=torch.empty(x.shape, dtype=wrong_float))),
        ("out shape", "out", dict(out=torch.empty(M + 1, H, dtype=x.dtype))),
        ("out non-contiguous", "out", dict(out=_non_contiguous(torch.empty_like(x)))),
        ("out not a tensor", "out", dict(out=x.tolist())),
        ("prepared is None", "prepared", dict(prepared=None)),
        ("prepared is the raw weights", "prepared", dict(prepared=b.weights)),
    ]
    if prepared_other is not None:
        choices.append(("prepared made for another spec", "prepared", dict(prepared=prepared_other)))
    what, arg, change = rng.choice(choices)
    args = dict(x=x, tw=tw, ti=ti, prepared=b.prepared, out=None) | change
    return [Invalid(f"{case.backend} {case.spec_id}: {what}", arg,
                    lambda: b.kernel(args["x"], args["tw"], args["ti"], args["prepared"], out=args["out"]))]


def _weights_mutations(rng: random.Random, pool: Pool) -> list:
    case = rng.choice(pool.cases["moe"] + pool.cases["moe_masked"])
    b = harness.built(case)
    w, spec = b.weights, case.spec
    E = spec.num_experts
    choices = [
        ("w13 shape", "w13", dict(w13=w.w13[:-1] if w.w13.shape[0] > 1 else w.w13.repeat(2, 1, 1))),
        ("w2 dtype", "w2", dict(w2=w.w2.view(torch.uint8) if w.w2.element_size() != 1
                                else w.w2.to(torch.int32))),
        ("w13 not a tensor", "w13", dict(w13=[1, 2])),
        ("b13 without has_bias" if not spec.has_bias else "b13 missing", "b13",
         dict(b13=None if spec.has_bias else torch.zeros(spec.local_experts, spec.w13_rows))),
    ]
    if w.w13_scale is not None:
        choices.append(("w13_scale missing", "w13_scale", dict(w13_scale=None)))
        s2 = w.w2_scale
        choices.append(("w2_scale shape", "w2_scale",
                        dict(w2_scale=s2[..., :-1] if s2.shape[-1] > 1 else s2.repeat(1, 1, 2))))
    if spec.is_ep:
        m = w.expert_map
        oob, dup, small = m.clone(), m.clone(), m.clone()
        oob[rng.randrange(E)] = rng.choice([spec.local_experts, spec.local_experts + 7, -2, -100])
        locals_ = torch.nonzero(m >= 0).flatten().tolist()
        remote = torch.nonzero(m < 0).flatten().tolist()
        dup[rng.choice(remote)] = m[rng.choice(locals_)]  # two global ids on one local expert
        choices += [
            ("expert_map value out of range", "expert_map", dict(expert_map=oob)),
            ("expert_map duplicate local id", "expert_map", dict(expert_map=dup)),
            ("expert_map int64", "expert_map", dict(expert_map=m.long())),
            ("expert_map wrong length", "expert_map", dict(expert_map=small[:-1])),
            ("expert_map missing", "expert_map", dict(expert_map=None)),
            ("expert_map on the meta device", "expert_map",
             dict(expert_map=torch.empty(m.shape, dtype=m.dtype, device="meta"))),
        ]
    what, arg, change = rng.choice(choices)

    def call():
        from hal.spec import MoEWeights

        fields = attrs.asdict(w, recurse=False) | change
        return b.kernel.prepare_weights(MoEWeights(**fields))

    return [Invalid(f"{case.backend} {case.spec_id}: {what}", arg, call)]


def _masked_mutations(rng: random.Random, pool: Pool, op: str) -> list:
    case = rng.choice(pool.cases[op])
    b = harness.built(case)
    E, H = case.spec.num_experts if op == "requant" else case.spec.local_experts, case.spec.hidden_size
    max_m = rng.randint(1, 6)
    counts = [rng.randint(0, max_m) for _ in range(E)]
    from hal import synth

    dev = case.device  # every argument but the one under test is valid, its device included
    x, xs, mm = synth.random_masked_inputs(E, H, max_m, counts, seed=rng.randint(0, 1 << 20),
                                           device=dev, fp8_dtype=harness.fp8_dtype(case))
    over = mm.clone()
    over[rng.randrange(E)] = rng.choice([max_m + 1, -1, 1 << 20])
    choices = [
        ("x bf16", "x", dict(x=x.to(torch.bfloat16))),
        ("x wrong experts", "x", dict(x=torch.cat([x, x]))),
        ("x non-contiguous", "x", dict(x=_non_contiguous(x))),
        ("x not a tensor", "x", dict(x=None)),
        ("x_scale shape", "x_scale",
         dict(xs=xs[:, :, :1].repeat(1, 1, 2) if H // 128 == 1 else xs[:, :, :1])),
        ("x_scale bf16", "x_scale", dict(xs=xs.to(torch.bfloat16))),
        ("masked_m out of range", "masked_m", dict(mm=over)),
        ("masked_m int64", "masked_m", dict(mm=mm.long())),
        ("masked_m shape", "masked_m", dict(mm=torch.cat([mm, mm]))),
        ("expected_rows negative", "expected_rows", dict(expected_rows=-rng.randint(1, 9))),
        ("expected_rows float", "expected_rows", dict(expected_rows=1.5)),
        ("expected_rows a bool", "expected_rows", dict(expected_rows=rng.choice([True, False]))),
        ("out shape", "out", dict(out=torch.empty(E, max_m + 1, H, dtype=torch.bfloat16, device=dev))),
    ]
    if op == "requant":
        choices += [
            ("output_scale zero", "output_scale", dict(s=torch.tensor([0.0], device=dev))),
            ("output_scale inf", "output_scale", dict(s=torch.tensor([float("inf")], device=dev))),
            ("output_scale subnormal", "output_scale",
             dict(s=torch.tensor([rng.choice([1e-45, 1e-40, 5e-39])], device=dev))),
            ("output_scale two elements", "output_scale", dict(s=torch.tensor([1.0, 2.0], device=dev))),
            ("output_scale float64", "output_scale",
             dict(s=torch.tensor([0.1], dtype=torch.float64, device=dev))),
            ("out bf16", "out", dict(out=torch.empty(x.shape, dtype=torch.bfloat16, device=dev))),
        ]
    else:
        choices.append(("prepared is None", "prepared", dict(prepared=None)))
    plans = [  # plan() takes the same counts as the call
        ("plan expected_rows a bool", "expected_rows", lambda: b.kernel.plan(
            *([max_m] if op == "requant" else [mm]), expected_rows=True)),
        ("plan max_m negative" if op == "requant" else "plan masked_m float",
         "max_m" if op == "requant" else "masked_m",
         (lambda: b.kernel.plan(-1)) if op == "requant" else (lambda: b.kernel.plan(mm.float()))),
    ]
    if rng.random() < len(plans) / (len(plans) + len(choices)):
        what, arg, call = rng.choice(plans)
        return [Invalid(f"{case.backend} {case.spec_id}: {what}", arg, call)]
    what, arg, change = rng.choice(choices)
    args = dict(x=x, xs=xs, mm=mm, s=torch.tensor([0.02], device=dev), out=None, expected_rows=None,
                prepared=b.prepared) | change
    if op == "requant":
        call = lambda: b.kernel(args["x"], args["xs"], args["mm"], args["s"], out=args["out"],  # noqa: E731
                                expected_rows=args["expected_rows"])
    else:
        call = lambda: b.kernel(args["x"], args["xs"], args["mm"], args["prepared"],  # noqa: E731
                                expected_rows=args["expected_rows"], out=args["out"])
    return [Invalid(f"{case.backend} {case.spec_id}: {what}", arg, call)]


def _selection_mutations(rng: random.Random, pool: Pool) -> list:
    import hal

    spec = MOE_SPECS["bf16-silu"]
    choices = [
        ("select device unknown", "device", lambda: hal.select_moe_kernel(
            spec, rng.choice(["tpu", "cuda:x", "", "gpu0"]), caps=caps_for(pool.device))),
        ("select_moe_kernel given a RequantSpec", "spec", lambda: hal.select_moe_kernel(
            REQUANT_SPECS["requant-e2-h128"], "cpu", caps=caps_for(pool.device))),
        ("select_requant_kernel given a MoESpec", "spec", lambda: hal.select_requant_kernel(
            spec, "cpu", caps=caps_for(pool.device))),
        ("weights not MoEWeights", "weights", lambda: harness.built(rng.choice(pool.cases["moe"]))
         .kernel.prepare_weights({"w13": None})),
        ("select strict not a bool", "strict", lambda: hal.select_moe_kernel(
            spec, "cpu", caps=caps_for(pool.device), strict="yes")),
        ("caps field of the wrong type", "permitted", lambda: _caps_with_amx_permitted("no")),
    ]
    if not torch.cuda.is_available():
        choices.append(("select device cuda without a GPU", "device",
                        lambda: hal.select_moe_kernel(spec, rng.choice(["cuda", "cuda:1"]))))
    what, arg, call = rng.choice(choices)
    return [Invalid(what, arg, call)]


def _caps_with_amx_permitted(value):
    """Caps read back from JSON whose cpu.amx.permitted holds `value`."""
    from hal.caps import Caps

    data = json.loads(Caps().to_json())
    data["cpu"]["amx"]["permitted"] = value
    return Caps.from_json(json.dumps(data))


def invalid_cases(rng: random.Random, pool: Pool):
    families = [_spec_mutations, _requant_spec_mutations]
    if pool.cases["moe"]:
        families += [lambda r: _token_mutations(r, pool)] * 4 + [lambda r: _weights_mutations(r, pool)] * 2
        families.append(lambda r: _selection_mutations(r, pool))
    for op in ("moe_masked", "requant"):
        if pool.cases[op]:
            families.append(lambda r, op=op: _masked_mutations(r, pool, op))
    while True:
        yield from rng.choice(families)(rng)


def check_invalid(index: int, case: Invalid) -> str:
    """'' when the case raised a ValueError naming its argument, else what went wrong."""
    try:
        case.call()
    except ValueError as exc:
        if names_argument(str(exc), case.arg):
            return ""
        return f"invalid {index}: {case.what}: ValueError does not name {case.arg!r}: {exc}"
    except Exception as exc:  # anything else breaks the contract
        return (f"invalid {index}: {case.what}: {type(exc).__name__} instead of ValueError naming "
                f"{case.arg!r}: {exc}")
    return f"invalid {index}: {case.what}: no error"


def random_valid_spec(rng: random.Random) -> MoESpec:
    fmt = rng.choice(["bf16", "fp8_block128", "mxfp4", "int4_g128"])
    group = rng.choice([128, -1]) if fmt == "int4_g128" else 128
    unit = {"bf16": 32, "fp8_block128": 32, "mxfp4": 32, "int4_g128": 128 if group == 128 else 64}[fmt]
    E = rng.randint(1, 12)
    ep = E > 1 and rng.random() < 0.3
    return MoESpec(num_experts=E, top_k=rng.randint(1, min(E, 4)), hidden_size=unit * rng.randint(1, 3),
                   intermediate_size=unit * rng.randint(1, 3), weight_format=fmt,
                   activation=rng.choice(["silu", "swiglu_oai", "relu2"]), has_bias=rng.random() < 0.4,
                   num_local_experts=rng.randint(1, E - 1) if ep else None, group_size=group)


def run_valid(rng: random.Random, pool: Pool, index: int, runs: dict) -> str:
    """One random valid spec and call on a random backend that accepts it; '' when it matches.
    `runs` counts the calls per backend."""
    from hal.backend import Target

    spec = random_valid_spec(rng)
    target = Target(pool.device, caps_for(pool.device))
    found = [f for f in harness.discovered() if f.name in pool.backends and serves(f.backend, spec)
             and checked(f.backend, spec, target).ok]
    found = [f for f in found if not Case(f.name, pool.device, "", spec, target.caps,
                                          checked(f.backend, spec, target).notes).interpreted]
    if not found:
        runs["no backend"] = runs.get("no backend", 0) + 1
        return ""
    name = rng.choice(found).name
    runs[name] = runs.get(name, 0) + 1
    case = Case(name, pool.device, f"valid{index}", spec, target.caps, ())
    b = harness.built(case)
    M = rng.randint(0, 12)
    mode = rng.choice(["uniform", "concentrated", "one_expert"]) if spec.top_k > 1 else "uniform"
    x, tw, ti = harness.token_inputs(spec, M, pool.device, seed=rng.randint(0, 1 << 30), mode=mode,
                                     **({"hot_expert": rng.randrange(spec.num_experts)}
                                        if mode == "one_expert" else {}))
    out = b.kernel(x, tw, ti, b.prepared)
    harness.built.cache_clear()  # each valid case has its own weights; keep memory flat
    if M == 0:
        return "" if tuple(out.shape) == (0, spec.hidden_size) else f"{name} {spec}: M=0 gave {out.shape}"
    err = rel_err(out, harness.token_oracle(spec, x, tw, ti, b.weights))
    return "" if err <= ACCURACY else f"{name} {spec} M={M} {mode}: rel err {err:.3e} > {ACCURACY}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hal.testing.fuzz")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--invalid", type=int, default=1000)
    parser.add_argument("--valid", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    # Thousands of tiny calls: on one thread, since waking a thread pool costs more than each call.
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    pool = Pool(args.device, interpreted_ok=True)
    start = time.monotonic()
    failures, named, runs = [], {}, {}
    cases = invalid_cases(rng, pool)
    for i in range(args.invalid):
        case = next(cases)
        print(json.dumps({"case": i, "what": case.what}), flush=True)
        named[case.arg] = named.get(case.arg, 0) + 1
        error = check_invalid(i, case)
        if error:
            failures.append(error)
    harness.built.cache_clear()
    for i in range(args.valid):
        print(json.dumps({"case": args.invalid + i, "what": "valid"}), flush=True)
        error = run_valid(rng, pool, i, runs)
        if error:
            failures.append(f"valid {i}: {error}")
    summary = {"seed": args.seed, "invalid": args.invalid, "valid": args.valid, "failures": failures,
               "backends": pool.backends, "invalid_by_argument": named, "valid_by_backend": runs,
               "seconds": round(time.monotonic() - start, 1)}
    print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
