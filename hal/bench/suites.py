"""Named benchmark suites: the `hal bench moe|requant` runs behind each backend's published
numbers, one command on any machine (`hal bench suite NAME`). An entry is the argument list of one
`hal bench` run, so a suite times exactly what that single command times, through the same
harness."""

from __future__ import annotations

import attrs

MARLIN_TOKENS = "1,8,32,64,256,2048"
CPU_TOKENS = "1,4,16,64,256,1024"
TRITON_MOE_TOKENS = "1,8,64,512,4096"


@attrs.frozen
class Suite:
    name: str
    device: str  # the device its entries default to
    about: str
    entries: tuple  # (label, argv of `hal bench`)


SUITES = {s.name: s for s in (
    Suite("smoke", "cpu", "a tiny layer through the whole harness in seconds: checks a machine, not a "
          "figure", (
              ("tiny_bf16", ("moe", "--experts", "8", "--top-k", "2", "--hidden", "256",
                             "--intermediate", "128", "--tokens", "1,16", "--iters", "3",
                             "--warmup", "1")),)),
    Suite("cpu_brgemm", "cpu", "cpu_brgemm against its layer-wide rule and the torch reference on "
          "three public layers, uniform and concentrated routing", (
              ("qwen3_fp8", ("moe", "--model", "qwen3-30b-a3b", "--format", "fp8_block128",
                             "--backend", "cpu_brgemm", "--tokens", CPU_TOKENS,
                             "--routing", "uniform,concentrated")),
              ("gptoss20b_mxfp4", ("moe", "--model", "gpt-oss-20b", "--backend", "cpu_brgemm",
                                   "--tokens", CPU_TOKENS, "--routing", "uniform,concentrated")),
              ("dsv3_fp8_ep32", ("moe", "--model", "deepseek-v3", "--format", "fp8_block128",
                                 "--local-experts", "32", "--backend", "cpu_brgemm",
                                 "--tokens", CPU_TOKENS, "--routing", "uniform,concentrated")))),
    Suite("marlin", "cuda", "Marlin W4A16 against its first-valid config, its runtime-branch build "
          "and the torch reference on three public layers", (
              ("mixtral", ("moe", "--model", "mixtral-8x7b", "--format", "int4_g128",
                           "--tokens", MARLIN_TOKENS, "--iters", "10")),
              ("qwen3", ("moe", "--model", "qwen3-30b-a3b", "--format", "int4_g128",
                         "--tokens", MARLIN_TOKENS, "--iters", "10")),
              ("deepseek_ep8", ("moe", "--model", "deepseek-v3", "--format", "int4_g128",
                                "--local-experts", "32", "--tokens", MARLIN_TOKENS, "--iters", "10")))),
    Suite("triton_moe", "cuda", "the Triton fused MoE on the public layers it serves, bf16, "
          "fp8_block128 and mxfp4, against rooflines measured in the same run", tuple(
              (label, ("moe", *layer, "--backend", "triton_moe", "--tokens", TRITON_MOE_TOKENS,
                       "--iters", "5", "--no-reference"))
              for label, layer in (
                  ("qwen3_bf16", ("--model", "qwen3-30b-a3b", "--format", "bf16")),
                  ("qwen3_fp8", ("--model", "qwen3-30b-a3b", "--format", "fp8_block128")),
                  ("dsv3_fp8_ep8", ("--model", "deepseek-v3", "--format", "fp8_block128",
                                    "--local-experts", "32")),
                  ("mixtral_bf16", ("--model", "mixtral-8x7b", "--format", "bf16")),
                  ("gptoss120b_mxfp4", ("--model", "gpt-oss-120b", "--format", "mxfp4"))))),
    Suite("requant", "cuda", "the FP8 requant against the legacy launch geometry over the default "
          "grid, then decode points in DeepEP's fixed 1024-row buffer", (
              ("grid", ("requant", "--iters", "7")),
              ("deepep_buffer", ("requant", "--hidden", "7168", "--experts", "8,256,512", "--rows", "1,8",
                                 "--skew", "1,16", "--min-max-m", "1024", "--iters", "7")))),
)}


def get(name: str) -> Suite:
    if name not in SUITES:
        raise ValueError(f"suite {name!r} is not known: expected one of {', '.join(SUITES)}")
    return SUITES[name]
