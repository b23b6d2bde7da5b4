"""cpu_brgemm's kept scratch: a call larger than the scratch cap runs in token chunks, each exactly
a call of its tokens alone, so the scratch kept after it stays within the peak the contract states;
hal.release_scratch() hands all of it back."""

from __future__ import annotations

import pytest
import torch
from cpu_brgemm_helpers import check_against_reference, isa_params, machine_target, make_kernel, weights_for
from hal.backends.cpu_brgemm.policy import BLOCK_M, BLOCK_N, MAX_PANEL_GROUP, SCRATCH_CAP_BYTES

import hal
from hal import synth
from hal.spec import MoESpec

pytestmark = pytest.mark.cpu

CHUNK = 64  # tokens per pass, set on the kernel in place of the cap's


def peak_bytes(spec, tokens, threads):
    """docs/contract.md's peak: the compact caches of one pass, top_k x (6H + 2I) bytes a token, and
    per worker thread its output tiles, dequantized panels, TinyGEMM buffers and a reduce row, with
    k = max(H, I); every buffer rounded up to 64 bytes."""
    k = max(spec.hidden_size, spec.intermediate_size)
    caches = tokens * spec.top_k * (6 * spec.hidden_size + 2 * spec.intermediate_size) + 3 * 64
    worker = (2 * BLOCK_M * k * 4 + 2 * k * min(k, MAX_PANEL_GROUP * BLOCK_N) * 2 + 2 * BLOCK_M * k * 4
              + 4 * spec.hidden_size + 7 * 64)
    return caches + threads * worker


def test_the_cap_sets_the_chunk():
    spec = MoESpec(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768,
                   weight_format="fp8_block128")
    kernel = make_kernel(spec, machine_target(), "avx2")
    assert kernel.max_chunk_tokens == SCRATCH_CAP_BYTES // (8 * (6 * 2048 + 2 * 768))
    tokens = 3 * kernel.max_chunk_tokens + 1
    ids = synth.random_routing(spec, tokens, seed=1)[1]
    plan = kernel.plan(ids)
    assert plan.passes == 4 and "in 4 passes" in plan.describe()
    assert plan.local_routes == tokens * 8


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("fmt", ["fp8_block128", "mxfp4"])
def test_chunks_are_calls_of_their_tokens_and_release_frees(isa, fmt):
    spec = MoESpec(num_experts=8, top_k=2, hidden_size=512, intermediate_size=64, weight_format=fmt,
                   activation="swiglu_oai" if fmt == "mxfp4" else "silu", has_bias=True)
    weights = weights_for(spec, seed=51)
    kernel = make_kernel(spec, machine_target(), isa)
    kernel.max_chunk_tokens = CHUNK
    prepared = kernel.prepare_weights(weights)
    tokens = 20 * CHUNK
    tw, ti = synth.random_routing(spec, tokens, mode="concentrated", seed=52)
    x = synth.random_tokens(spec, tokens, seed=53)
    threads = torch.get_num_threads()
    assert hal.release_scratch() == 0
    assert hal.scratch_bytes() == 0
    out = check_against_reference(kernel, weights, prepared, x, tw, ti)
    held = hal.scratch_bytes()
    whole_call_caches = tokens * spec.top_k * (6 * spec.hidden_size + 2 * spec.intermediate_size)
    assert 0 < held <= peak_bytes(spec, CHUNK, threads) < whole_call_caches / 2
    assert hal.release_scratch() == 0
    assert hal.scratch_bytes() == 0
    parts = [kernel(x[t:t + CHUNK], tw[t:t + CHUNK], ti[t:t + CHUNK], prepared)
             for t in range(0, tokens, CHUNK)]
    assert torch.equal(out, torch.cat(parts))


@pytest.mark.parametrize("fmt", ["bf16", "mxfp4"])
def test_chunked_equals_unchunked_where_rows_are_independent(fmt):
    """The avx2 build computes each row alone in a fixed order with bf16 and mxfp4 weights (its fp8
    path and the AVX-512 build round by block size), so there chunking changes no bit."""
    spec = MoESpec(num_experts=8, top_k=2, hidden_size=96, intermediate_size=64, weight_format=fmt,
                   activation="swiglu_oai", has_bias=True)
    weights = weights_for(spec, seed=61)
    chunked = make_kernel(spec, machine_target(), "avx2")
    chunked.max_chunk_tokens = 7
    whole = make_kernel(spec, machine_target(), "avx2")
    prepared = whole.prepare_weights(weights)
    tw, ti = synth.random_routing(spec, 150, mode="concentrated", seed=62)
    x = synth.random_tokens(spec, 150, seed=63)
    assert chunked.plan(ti).passes == 22 and whole.plan(ti).passes == 1
    assert torch.equal(chunked(x, tw, ti, prepared), whole(x, tw, ti, prepared))


def test_release_reaches_every_registered_holder(monkeypatch):
    """hal names no backend: backends register holders, and release_scratch frees each and returns
    what they still keep (a holder whose buffers belong to a call running meanwhile)."""
    from hal import scratch

    monkeypatch.setattr(scratch, "_holders", {})
    kept = {"a": 4096, "b": 128}
    scratch.register("a", lambda: kept.update(a=0), lambda: kept["a"])
    scratch.register("b", lambda: None, lambda: kept["b"])  # b's call is running
    assert hal.scratch_bytes() == 4096 + 128
    assert hal.release_scratch() == 128
    assert kept == {"a": 0, "b": 128}
    with pytest.raises(ValueError, match="name"):
        scratch.register("", lambda: None, lambda: 0)
