"""The spec options shared by `hal select`, `hal bench` and `hal build`: a model preset, or the
layer's dimensions spelled out."""

from __future__ import annotations

import argparse

from hal import presets
from hal.spec import ACT_DTYPES, ACT_QUANTS, ACTIVATIONS, WEIGHT_FORMATS, MoESpec


def add(parser: argparse.ArgumentParser, required: bool = True) -> None:
    g = parser.add_argument_group("layer (a --model preset, or the dimensions)")
    g.add_argument("--model", choices=sorted(presets.PRESETS), help="a public model's MoE layer")
    g.add_argument("--experts", type=int, help="num_experts")
    g.add_argument("--top-k", type=int, help="experts per token")
    g.add_argument("--hidden", type=int, help="hidden_size")
    g.add_argument("--intermediate", type=int, help="per-expert intermediate_size")
    g.add_argument("--format", choices=WEIGHT_FORMATS, help="weight format (default: the preset's)")
    g.add_argument("--activation", choices=ACTIVATIONS)
    g.add_argument("--bias", action="store_true", default=None, help="the experts have biases")
    g.add_argument("--local-experts", type=int, help="expert parallelism: experts on this rank")
    g.add_argument("--act-dtype", choices=ACT_DTYPES)
    g.add_argument("--act-quant", choices=ACT_QUANTS,
                   help="activation numerics: none (default), or fp8_g128 (e4m3 per token and 128 columns)")
    parser.set_defaults(_spec_required=required)


def spec_from(args) -> MoESpec:
    overrides = {k: v for k, v in dict(
        num_experts=args.experts, top_k=args.top_k, hidden_size=args.hidden,
        intermediate_size=args.intermediate, activation=args.activation, has_bias=args.bias,
        num_local_experts=args.local_experts, act_dtype=args.act_dtype,
        act_quant=args.act_quant).items() if v is not None}
    if args.model:
        return presets.get(args.model).spec(args.format, **overrides)
    missing = [flag for flag, key in (("--experts", "num_experts"), ("--top-k", "top_k"),
                                      ("--hidden", "hidden_size"), ("--intermediate", "intermediate_size"))
               if key not in overrides]
    if missing:
        raise ValueError("give --model, or all of " + ", ".join(missing))
    fmt = args.format or "bf16"
    return MoESpec(weight_format=fmt, layout="masked" if fmt == "w4afp8" else "tokens", **overrides)


def int_list(text: str) -> list:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected non-negative ints")
    return values


def str_list(text: str) -> list:
    return [v.strip() for v in text.split(",") if v.strip()]
