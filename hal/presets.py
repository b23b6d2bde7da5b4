"""MoE layers of public models, as their published configs give them."""

from __future__ import annotations

import attrs

from hal.spec import MoESpec


@attrs.frozen
class Preset:
    name: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int  # per-expert (moe_intermediate_size)
    formats: tuple  # checkpoint formats the model ships in; the first is the default
    activation: str = "silu"
    has_bias: bool = False
    source: str = ""

    def spec(self, weight_format=None, **overrides) -> MoESpec:
        fmt = weight_format or self.formats[0]
        fields = dict(num_experts=self.num_experts, top_k=self.top_k, hidden_size=self.hidden_size,
                      intermediate_size=self.intermediate_size, weight_format=fmt,
                      activation=self.activation, has_bias=self.has_bias,
                      layout="masked" if fmt == "w4afp8" else "tokens")
        fields.update(overrides)
        return MoESpec(**fields)


PRESETS = {p.name: p for p in (
    Preset("deepseek-v3", 256, 8, 7168, 2048, ("fp8_block128", "int4_g128", "w4afp8"),
           source="deepseek-ai/DeepSeek-V3 config.json: n_routed_experts 256, num_experts_per_tok 8, "
                  "hidden_size 7168, moe_intermediate_size 2048"),
    Preset("kimi-k2", 384, 8, 7168, 2048, ("fp8_block128", "int4_g128"),
           source="moonshotai/Kimi-K2-Instruct config.json: n_routed_experts 384, num_experts_per_tok 8"),
    Preset("qwen3-30b-a3b", 128, 8, 2048, 768, ("bf16", "fp8_block128"),
           source="Qwen/Qwen3-30B-A3B config.json: num_experts 128, num_experts_per_tok 8, "
                  "hidden_size 2048, moe_intermediate_size 768"),
    Preset("qwen3-235b-a22b", 128, 8, 4096, 1536, ("bf16", "fp8_block128"),
           source="Qwen/Qwen3-235B-A22B config.json: hidden_size 4096, moe_intermediate_size 1536"),
    Preset("gpt-oss-20b", 32, 4, 2880, 2880, ("mxfp4",), activation="swiglu_oai", has_bias=True,
           source="openai/gpt-oss-20b config.json: num_local_experts 32, experts_per_token 4"),
    Preset("gpt-oss-120b", 128, 4, 2880, 2880, ("mxfp4",), activation="swiglu_oai", has_bias=True,
           source="openai/gpt-oss-120b config.json: num_local_experts 128, experts_per_token 4"),
    Preset("mixtral-8x7b", 8, 2, 4096, 14336, ("bf16", "int4_g128"),
           source="mistralai/Mixtral-8x7B-v0.1 config.json: num_local_experts 8, "
                  "num_experts_per_tok 2, intermediate_size 14336"),
)}


def get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"model={name!r} is not a preset: expected one of "
                         + ", ".join(sorted(PRESETS))) from None
