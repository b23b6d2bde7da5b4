"""moe-hal as transformers' "moe_hal" experts implementation, on tiny random models built in code.

Each model runs once with transformers' eager experts and once with moe_hal; explain() must show
cpu_brgemm on every MoE layer (so the kernel ran, not the fallback), logits must agree within the
contract's 1e-2 and greedy generation must give the same tokens. Expert weights are re-drawn at a
scale where the MoE dominates the residual stream (transformers' 0.02 init would hide a wrong MoE)."""

from __future__ import annotations

import copy
import logging
import math
import types

import pytest

transformers = pytest.importorskip(
    "transformers", minversion="5.0",
    reason="the transformers integration needs transformers 5 (pip install 'moe-hal[transformers]')")

import torch  # noqa: E402
from hal.backends.reference.dequant import fp8_block  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    DeepseekV3Config,
    ErgoConfig,
    Glm5NextTextConfig,
    GptOssConfig,
    MixtralConfig,
    Qwen3MoeConfig,
)
from transformers.integrations.finegrained_fp8 import (  # noqa: E402
    ALL_FP8_EXPERTS_FUNCTIONS,
    FP8Experts,
)
from transformers.integrations.moe import use_experts_implementation  # noqa: E402

import hal.integrations.transformers as hal_tf  # noqa: E402
from hal.integrations.transformers.layer import eager_forward, layer_state  # noqa: E402
from hal.integrations.transformers.watch import sample_positions  # noqa: E402
from hal.spec import FP8_BLOCK  # noqa: E402
from hal.testing import ACCURACY, rel_err  # noqa: E402

pytestmark = pytest.mark.cpu

VOCAB = 128
NEW_TOKENS = 16
TIE_MARGIN = 0.05
# MoE routing is discontinuous: a rounding difference in one layer's output can flip a later
# layer's route near a tie, and then logits differ by far more than 1e-2 for reasons that are no
# kernel's fault. Unit embeddings with MoE outputs a fraction of them keep routes stable, and keep
# the rounding of eager's own bf16 intermediates (about 0.5% of the MoE output) well inside 1e-2.
GATE_UP_STD = 2.0
DOWN_STD = 0.15
# Per-layer checks feed hidden states of this scale, so gate/up values reach past GPT-OSS's clamp (7).
LAYER_INPUT_STD = 4.0
# Hidden and expert sizes are multiples of 32, the panel width cpu_brgemm packs.
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
              eos_token_id=None, tie_word_embeddings=False)


def qwen3_moe(**over):
    return Qwen3MoeConfig(**{**COMMON, "head_dim": 16, "intermediate_size": 96, "moe_intermediate_size": 32,
                             "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, **over})


def gpt_oss(**over):
    return GptOssConfig(**{**COMMON, "head_dim": 16, "intermediate_size": 64, "num_local_experts": 8,
                           "num_experts_per_tok": 2, "sliding_window": 8,
                           "layer_types": ["sliding_attention", "full_attention"], **over})


def mixtral(**over):
    return MixtralConfig(**{**COMMON, "intermediate_size": 96, "num_local_experts": 8,
                            "num_experts_per_tok": 2, **over})


def deepseek_v3(**over):
    return DeepseekV3Config(**{**COMMON, "intermediate_size": 96, "moe_intermediate_size": 32,
                               "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
                               "n_group": 2, "topk_group": 1, "first_k_dense_replace": 0,
                               "kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 16,
                               "qk_nope_head_dim": 16, "v_head_dim": 16, "num_key_value_heads": 4, **over})


@pytest.fixture(scope="module", autouse=True)
def registered():
    hal_tf.register()


def _redraw(model, generator):
    """Unit-scale token embeddings; expert weights with gate/up outputs of standard deviation
    GATE_UP_STD on unit inputs and MoE outputs a fraction (set by DOWN_STD) of the residual, so the MoE
    changes every logit while a rounding difference in it cannot flip a later route; router weights
    with clear top-k margins. In place."""
    for _, module in hal_tf.experts_modules(model):
        for name, p in module.named_parameters(recurse=False):
            if p.dtype not in (torch.bfloat16, torch.float32):
                continue
            if p.dim() == 3:
                fan_in = p.shape[1] if module.is_transposed else p.shape[2]
                scale = (DOWN_STD if name.startswith("down_proj") else GATE_UP_STD) / math.sqrt(fan_in)
            else:
                scale = 0.5 * DOWN_STD
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    embed = model.get_input_embeddings().weight
    with torch.no_grad():
        embed.copy_(torch.randn(embed.shape, generator=generator))
    for module in model.modules():
        if type(module).__name__.endswith("Router"):
            w = module.weight if hasattr(module, "weight") else module.linear.weight  # Ergo's router
            with torch.no_grad():
                w.copy_(torch.randn(w.shape, generator=generator) * 3.0 / math.sqrt(w.shape[1]))


def build(config, dtype=torch.bfloat16):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, experts_implementation="eager").eval()
    _redraw(model, torch.Generator().manual_seed(1))
    return model


def prompt(batch=2, length=7):
    return torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(2))


def run(model, ids):
    with torch.no_grad():
        logits = model(ids).logits.float()
        tokens = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return logits, tokens


def assert_same_greedy_tokens(tokens, eager_tokens, eager_model):
    """Greedy tokens equal eager's. Both runs are within the contract's 1e-2 of each other, not bit
    equal, so where eager's own top two logits lie within TIE_MARGIN (logit standard deviations)
    either choice is right: a sequence may part there, and only there."""
    for row in range(tokens.shape[0]):
        differ = (tokens[row] != eager_tokens[row]).nonzero()
        if not len(differ):
            continue
        step = int(differ[0])
        with torch.no_grad():
            logits = eager_model(eager_tokens[row: row + 1, :step]).logits[0, -1].float()
        top = logits.topk(2).values
        gap = float(top[0] - top[1]) / float(logits.std())
        assert gap <= TIE_MARGIN, (f"row {row} parts from eager at position {step}, where eager's top-2 "
                                   f"gap is {gap:.3g} standard deviations (a tie is <= {TIE_MARGIN})")


def assert_served_by_hal(model, backend="cpu_brgemm"):
    report = hal_tf.explain(model)
    assert report, "no experts module found"
    for layer in report.values():
        assert layer.implementation == hal_tf.NAME, str(layer)
        assert layer.backend == backend, str(layer)


def assert_layers_match(model, reference, M=9):
    """Each experts module against the eager forward of its counterpart in `reference`, on fresh
    random hidden states and routes."""
    g = torch.Generator().manual_seed(3)
    for (name, module), (_, ref) in zip(hal_tf.experts_modules(model), hal_tf.experts_modules(reference),
                                       strict=True):
        E, k = ref.num_experts, model.config.num_experts_per_tok
        H = module.down_proj.shape[2] if module.is_transposed else module.down_proj.shape[1]
        x = (torch.randn(M, H, generator=g) * LAYER_INPUT_STD).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)])
        weights = torch.softmax(torch.randn(M, k, generator=g), dim=-1)
        with torch.no_grad():
            got = module(x, ids, weights)
            want = eager_forward(ref)(ref, x, ids, weights)
        assert not torch.isnan(got).any(), name
        err = rel_err(got, want)
        assert err <= ACCURACY, f"{name}: rel err {err:.4g}"


# (activation, gate/up order, transposed, bias) the adapter must read off each experts class.
LAYOUTS = {
    "qwen3_moe": (qwen3_moe, ("silu", "concatenated", False, False)),
    "gpt_oss": (gpt_oss, ("swiglu_oai", "interleaved", True, True)),
    "mixtral": (mixtral, ("silu", "concatenated", False, False)),
    "deepseek_v3": (deepseek_v3, ("silu", "concatenated", False, False)),
}


@pytest.mark.parametrize("family", list(LAYOUTS))
def test_bf16_model_matches_eager(family):
    make, layout = LAYOUTS[family]
    model = build(make())
    ids = prompt()
    eager_logits, eager_tokens = run(model, ids)
    reference = copy.deepcopy(model)
    model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(model)
    assert_served_by_hal(model)
    for _, module in hal_tf.experts_modules(model):
        state = layer_state(module)
        spec = state.layout.spec
        found = (spec.activation, state.layout.activation.order, state.layout.transposed, spec.has_bias)
        assert found == layout
    assert_layers_match(model, reference)
    logits, tokens = run(model, ids)
    err = rel_err(logits, eager_logits)
    assert err <= ACCURACY, f"logits rel err {err:.4g}"
    assert_same_greedy_tokens(tokens, eager_tokens, reference)


def test_from_config_selects_moe_hal():
    model = AutoModelForCausalLM.from_config(qwen3_moe(), dtype=torch.bfloat16,
                                             experts_implementation=hal_tf.NAME).eval()
    assert model.config._experts_implementation == hal_tf.NAME
    with torch.no_grad():
        model(prompt(1, 3))
    assert_served_by_hal(model)


def test_from_pretrained_selects_moe_hal(tmp_path):
    """The loading path users take: a checkpoint on disk, experts_implementation at load time."""
    build(qwen3_moe()).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16,
                                                 experts_implementation=hal_tf.NAME).eval()
    assert model.config._experts_implementation == hal_tf.NAME
    with torch.no_grad():
        model(prompt(1, 3))
    assert_served_by_hal(model)


def _quantize_block128(w: torch.Tensor):
    """[E, rows, cols] -> float8_e4m3fn values and one fp32 scale per 128x128 block (w ~ q * s)."""
    E, rows, cols = w.shape
    R, C = math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)
    padded = torch.zeros(E, R * FP8_BLOCK, C * FP8_BLOCK)
    padded[:, :rows, :cols] = w.float()
    blocks = padded.view(E, R, FP8_BLOCK, C, FP8_BLOCK)
    scale = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-12) / 448.0
    q = (blocks / scale[:, :, None, :, None]).view(E, R * FP8_BLOCK, C * FP8_BLOCK)[:, :rows, :cols]
    return q.clamp(-448, 448).to(torch.float8_e4m3fn), scale


def _to_fp8_experts(model):
    """Replace every experts module with FP8Experts the way transformers' replace_with_fp8_linear
    does, holding the block-quantized weights; the bf16 model gets the dequantized ones, so both
    compute the same function."""
    fp8_model = copy.deepcopy(model)
    fp8_class = use_experts_implementation(experts_class=FP8Experts,
                                           experts_interface=ALL_FP8_EXPERTS_FUNCTIONS,
                                           has_bias=False, has_gate=True)
    for (name, module), (_, bf16) in zip(hal_tf.experts_modules(fp8_model), hal_tf.experts_modules(model),
                                         strict=True):
        fp8 = fp8_class(config=module.config, block_size=(FP8_BLOCK, FP8_BLOCK), activation_scheme="dynamic")
        with torch.no_grad():
            for proj in ("gate_up_proj", "down_proj"):
                q, s = _quantize_block128(getattr(bf16, proj))
                getattr(fp8, proj).copy_(q)
                getattr(fp8, f"{proj}_scale_inv").copy_(s)
                getattr(bf16, proj).copy_(fp8_block(q, s, torch.float32).to(torch.bfloat16))
        fp8_model.set_submodule(name, fp8)
    return fp8_model


@pytest.mark.parametrize("make", [deepseek_v3, qwen3_moe], ids=["deepseek_v3", "qwen3_moe"])
def test_fp8_block128_model_matches_dequantized_eager(make):
    """FP8Experts (fp8_block128) through moe_hal against the same model with the dequantized
    weights in bf16 through eager. transformers' own FP8 eager path needs a GPU kernel, so the
    dequantized bf16 model is the reference here. Two scale blocks along the gate/up rows need
    moe_intermediate_size >= 128."""
    model = build(make(hidden_size=128, moe_intermediate_size=128))
    fp8_model = _to_fp8_experts(model)
    ids = prompt()
    eager_logits, eager_tokens = run(model, ids)
    fp8_model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(fp8_model)
    assert_served_by_hal(fp8_model)
    assert all(layer.detail.count("fp8_block128") for layer in hal_tf.explain(fp8_model).values())
    assert_layers_match(fp8_model, model)
    logits, tokens = run(fp8_model, ids)
    err = rel_err(logits, eager_logits)
    assert err <= ACCURACY, f"logits rel err {err:.4g}"
    assert_same_greedy_tokens(tokens, eager_tokens, model)


@pytest.mark.parametrize("case", ["float32", "float16", "gelu"])
def test_unsupported_layer_falls_back_to_eager_with_one_summary_line(case, caplog):
    """float32 and float16 weights (no backend takes them) and an activation moe-hal lacks (gelu):
    every layer runs eager and the output equals eager's bit for bit; prepare() warns once for the
    model, and each layer says why once, at info level, over prepare, a forward and 16 decode steps."""
    if case == "gelu":
        model, why = build(qwen3_moe(hidden_act="gelu")), "matches none of the activations"
    else:
        dtype = getattr(torch, case)
        model, why = build(qwen3_moe(), dtype=dtype), f"{dtype} expert weights are not served"
    ids = prompt()
    eager_logits, eager_tokens = run(model, ids)
    model.set_experts_implementation(hal_tf.NAME)
    with caplog.at_level(logging.INFO, logger="hal.integrations.transformers"):
        report = hal_tf.prepare(model)
        logits, tokens = run(model, ids)
    assert torch.equal(logits, eager_logits)
    assert torch.equal(tokens, eager_tokens)
    records = [r for r in caplog.records if r.name == "hal.integrations.transformers"]
    layers = [name for name, _ in hal_tf.experts_modules(model)]
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert warnings == [f"moe_hal: {len(layers)} MoE layers: {len(layers)} fall back to their eager forward "
                        "(hal.integrations.transformers.explain(model) says why)"]
    for name in layers:
        mine = [r.getMessage() for r in records if f" {name} " in r.getMessage()]
        assert len(mine) == 1, mine
        assert "falls back to its eager forward" in mine[0] and why in mine[0]
    for layer in report.values():
        assert layer.backend == "eager" and why in layer.detail


def test_prepare_logs_one_summary_line(caplog):
    model = build(mixtral())
    model.set_experts_implementation(hal_tf.NAME)
    with caplog.at_level(logging.DEBUG, logger="hal.integrations.transformers"):
        report = hal_tf.prepare(model)
    above_debug = [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG]
    assert above_debug == ["moe_hal: 2 MoE layers: 2 on cpu_brgemm"] == [report.summary()]


def test_forward_without_prepare_names_layers_by_path(caplog):
    """A model loaded with moe_hal names its layers by their module path in every message, also when
    a forward meets them before prepare() or explain() does."""
    model = AutoModelForCausalLM.from_config(qwen3_moe(), dtype=torch.float32,
                                             experts_implementation=hal_tf.NAME).eval()
    with caplog.at_level(logging.WARNING, logger="hal.integrations.transformers"), torch.no_grad():
        model(prompt(1, 3))
    lines = [r.getMessage() for r in caplog.records if r.name == "hal.integrations.transformers"]
    assert lines == [f"moe_hal: model.layers.{i}.mlp.experts falls back to its eager forward: torch.float32 "
                     "expert weights are not served: moe-hal reads bfloat16 (bf16) or float8_e4m3fn with "
                     "128x128 block scales (fp8_block128) expert weights; load the model with "
                     "dtype=torch.bfloat16" for i in range(2)]


def test_moe_hal_before_register_says_to_call_it(monkeypatch):
    from transformers.integrations.finegrained_fp8 import FP8ExpertsInterface
    from transformers.integrations.moe import ExpertsInterface

    for interface in (ExpertsInterface, FP8ExpertsInterface):
        monkeypatch.delitem(interface._global_mapping, hal_tf.NAME)
    with pytest.raises(ValueError, match=r"call hal\.integrations\.transformers\.register\(\) once"):
        AutoModelForCausalLM.from_config(qwen3_moe(), experts_implementation=hal_tf.NAME)
    model = build(qwen3_moe(num_hidden_layers=1))
    with pytest.raises(ValueError, match=r"register\(\)"):
        model.set_experts_implementation(hal_tf.NAME)


def test_weights_changed_in_place_are_prepared_again():
    model = build(mixtral())
    model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(model)
    reference = copy.deepcopy(model)
    reference.set_experts_implementation("eager")
    with torch.no_grad():
        for m in (model, reference):
            for _, module in hal_tf.experts_modules(m):
                module.down_proj.mul_(-0.5)
    assert_layers_match(model, reference)


def test_expert_parallel_sentinels_add_nothing():
    """transformers' expert parallelism marks off-rank routes with id == the local expert count; the
    adapter turns them into -1 routes, which must equal eager's skipping of them."""
    model = build(qwen3_moe())
    model.set_experts_implementation(hal_tf.NAME)
    _, module = hal_tf.experts_modules(model)[0]
    module._is_expert_parallel = True
    g = torch.Generator().manual_seed(4)
    M, E, k = 11, module.num_experts, model.config.num_experts_per_tok
    x = (torch.randn(M, module.hidden_dim, generator=g) * LAYER_INPUT_STD).to(torch.bfloat16)
    ids = torch.randint(0, E, (M, k), generator=g)
    ids[::2, 0] = E
    ids[3] = E  # a token with no local route at all
    weights = torch.rand(M, k, generator=g)
    with torch.no_grad():
        got = module(x, ids, weights)
        want = eager_forward(module)(module, x, ids, weights)
    assert layer_state(module).backend == "cpu_brgemm"
    assert rel_err(got, want) <= ACCURACY
    assert torch.count_nonzero(got[3]) == 0


def test_reference_only_layer_runs_eager(monkeypatch, caplog):
    """Where only the reference oracle accepts a layer, the eager forward runs instead and says why."""
    monkeypatch.setenv("HAL_DISABLE_BACKENDS", "cpu_brgemm")
    model = build(mixtral())
    model.set_experts_implementation(hal_tf.NAME)
    with caplog.at_level(logging.INFO, logger="hal.integrations.transformers"):
        report = hal_tf.prepare(model)
        with torch.no_grad():
            model(prompt(1, 3))
    for layer in report.values():
        assert layer.backend == "eager" and "only the reference backend" in layer.detail
    assert sum("only the reference backend" in r.getMessage() for r in caplog.records) == len(report)


def _served_with_reference(make=mixtral):
    """A model served by moe_hal after prepare(), and an eager copy of it."""
    model = build(make())
    model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(model)
    reference = copy.deepcopy(model)
    reference.set_experts_implementation("eager")
    return model, reference


@pytest.mark.parametrize("write", ["data_copy", "data_assign"])
def test_weights_written_through_data_are_prepared_again(write):
    """RL trainers push new weights into a serving model through `param.data`, which bumps no version
    counter the module sees: the next forward must still run the new weights."""
    model, reference = _served_with_reference()
    for m in (model, reference):
        for _, module in hal_tf.experts_modules(m):
            for proj in ("gate_up_proj", "down_proj"):
                p = getattr(module, proj)
                new = p.detach().flip(0) * -0.5
                if write == "data_copy":
                    p.data.copy_(new)
                else:
                    p.data = new.clone()
    assert_layers_match(model, reference)


def test_refresh_prepares_weights_the_per_forward_check_misses():
    """A write through `.data` that leaves every sampled element as it was is invisible to the
    per-forward check; refresh() repacks every layer from the weights as they are."""
    model, reference = _served_with_reference()
    for m in (model, reference):
        for _, module in hal_tf.experts_modules(m):
            w = module.down_proj
            sampled = torch.zeros(w.numel(), dtype=torch.bool)
            sampled[sample_positions(w)] = True
            w.data.copy_(torch.where(sampled.view(w.shape), w.detach(), -0.5 * w.detach()))
    with pytest.raises(AssertionError, match="rel err"):
        assert_layers_match(model, reference)
    report = hal_tf.refresh(model)
    assert all(layer.backend == "cpu_brgemm" for layer in report.values())
    assert_layers_match(model, reference)


def ergo(**over):
    return ErgoConfig(**{**COMMON, "first_dense_intermediate_size": 96, "num_dense_blocks": 1,
                         "moe_intermediate_size": 32, "shared_intermediate_size": 64, "num_experts": 8,
                         "num_experts_per_tok": 2, "sliding_window": 8, "global_attention_every_n_layers": 2,
                         **over})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["served", "fallback"])
def test_subclass_forward_that_calls_the_dispatcher(dtype):
    """Ergo's experts override forward, give each route its own row and call the dispatching parent
    with top_k 1: explain() sees the layer, the kernel is selected for the top_k the parent receives,
    and a fallback runs the parent's eager forward instead of dispatching again."""
    model = build(ergo(), dtype=dtype)
    ids = prompt()
    with torch.no_grad():
        eager_logits = model(ids).logits.float()
    model.set_experts_implementation(hal_tf.NAME)
    names = [name for name, _ in hal_tf.experts_modules(model)]
    assert names == ["model.layers.1.mlp.experts"]
    assert hal_tf.prepare(model)[names[0]].backend == hal_tf.NOT_SELECTED
    with torch.no_grad():
        logits = model(ids).logits.float()
    layer = hal_tf.explain(model)[names[0]]
    if dtype == torch.float32:
        assert layer.backend == "eager" and torch.equal(logits, eager_logits)
    else:
        assert layer.backend == "cpu_brgemm" and "top_k=1," in layer.detail, str(layer)
        assert rel_err(logits, eager_logits) <= ACCURACY


def test_clamped_silu_with_a_limit_past_the_probe_falls_back():
    """A silu clamped at 20 (GLM-5-Next's gate) agrees with plain silu on small values: it must not be
    served as silu. moe-hal has no clamped silu, so the layer runs eager and says so."""
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextExperts

    config = Glm5NextTextConfig(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8,
                                num_experts_per_tok=2, swiglu_limit=20.0)
    config._experts_implementation = hal_tf.NAME
    module = Glm5NextTextExperts(config).to(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        module.gate_up_proj.copy_(torch.randn(module.gate_up_proj.shape, generator=g) * 3.0 / 8)
        module.down_proj.copy_(torch.randn(module.down_proj.shape, generator=g) * DOWN_STD / math.sqrt(32))
        x = (torch.randn(16, 64, generator=g) * LAYER_INPUT_STD).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(16)])
        weights = torch.softmax(torch.randn(16, 2, generator=g), dim=-1)
        got = module(x, ids, weights)
        want = eager_forward(module)(module, x, ids, weights)
    assert torch.equal(got, want)
    state = layer_state(module)
    assert state.backend == "eager" and "clamp limit of 20" in state.fallback, state.fallback


def _layer_inputs(module, M=9, k=2):
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(M, module.hidden_dim, generator=g) * LAYER_INPUT_STD).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(module.num_experts, generator=g)[:k] for _ in range(M)])
    return x, ids, torch.softmax(torch.randn(M, k, generator=g), dim=-1)


def test_top_k_under_other_config_names():
    """Gemma 4 keeps top_k as top_k_experts: selection at load reads it; a config that names top_k in
    no known field leaves selection to the first forward, which reads it off the routes."""
    model = build(qwen3_moe())
    model.set_experts_implementation(hal_tf.NAME)
    (first_name, first), (second_name, second) = hal_tf.experts_modules(model)
    first.config = types.SimpleNamespace(_experts_implementation=hal_tf.NAME, top_k_experts=2)
    second.config = types.SimpleNamespace(_experts_implementation=hal_tf.NAME)
    report = hal_tf.prepare(model)
    assert report[first_name].backend == "cpu_brgemm" and "top_k=2," in report[first_name].detail
    assert report[second_name].backend == hal_tf.NOT_SELECTED and layer_state(second).key is None
    x, ids, weights = _layer_inputs(second)
    with torch.no_grad():
        got = second(x, ids, weights)
        want = eager_forward(second)(second, x, ids, weights)
    assert rel_err(got, want) <= ACCURACY
    assert layer_state(second).top_k == 2 and layer_state(second).backend == "cpu_brgemm"


class _FailingOnce:
    """A kernel whose next call raises `error`, and which runs normally after that."""

    def __init__(self, kernel, error):
        self.kernel, self.error = kernel, error

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __call__(self, *args, **kwargs):
        error, self.error = self.error, None
        if error is not None:
            raise error
        return self.kernel(*args, **kwargs)


@pytest.mark.parametrize("error", [RuntimeError("CUDA out of memory"), ValueError("x has 3 columns")],
                         ids=["transient", "deterministic"])
def test_kernel_error_falls_back_for_that_call_or_for_good(error, caplog):
    """A transient kernel error runs that call eager and keeps the kernel; one the same call would
    raise again (a ValueError on shapes) turns the layer eager. The message says which."""
    model = build(qwen3_moe(num_hidden_layers=1))
    model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(model)
    name, module = hal_tf.experts_modules(model)[0]
    state = layer_state(module)
    state.kernel = _FailingOnce(state.kernel, error)
    x, ids, weights = _layer_inputs(module)
    with torch.no_grad():
        want = eager_forward(module)(module, x, ids, weights)
    with caplog.at_level(logging.WARNING, logger="hal.integrations.transformers"), torch.no_grad():
        first = module(x, ids, weights)
        after_first = hal_tf.explain(model)[name]
        second = module(x, ids, weights)
    assert torch.equal(first, want) and after_first.backend == "eager"
    [line] = [r.getMessage() for r in caplog.records]
    if isinstance(error, ValueError):
        assert "runs eager from now on" in line and torch.equal(second, want)
        assert hal_tf.explain(model)[name].backend == "eager"
    else:
        assert "the next one tries the kernel again" in line and "CUDA out of memory" in after_first.detail
        assert hal_tf.explain(model)[name].backend == "cpu_brgemm"
        assert rel_err(second, want) <= ACCURACY and not torch.equal(second, want)


def test_explain_reports_an_autograd_fallback():
    """A forward under autograd runs eager; explain() says so until a forward runs the kernel again."""
    model = build(mixtral())
    model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(model)
    ids = prompt(1, 3)
    model(ids)
    for layer in hal_tf.explain(model).values():
        assert layer.backend == "eager" and "autograd is recording" in layer.detail, str(layer)
    with torch.no_grad():
        model(ids)
    assert_served_by_hal(model)
