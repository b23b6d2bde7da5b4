"""The repacked mxfp4 layout (backends/triton_moe/mxfp4_repacked.py) decoded by the GEMMs' own step
tile, in both operand orders: every e2m1 nibble under e8m0 exponents from 0 to 250 (above 128 the
scale takes two multiplies), and from 0 to 128 with the one-multiply build, lands at its k bit for
bit equal to the float64 dequantization, on a K that is not a multiple of the 128-wide step, and
the padding decodes to zeros. In the interpreter on CPU (fp32 tiles) and on a CUDA GPU (bf16
tiles, scaled by fp32 multiplies and by bf16x2 FMAs)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from backends.reference import dequant
from backends.triton_moe import mxfp4_repacked

N, K = 24, 352  # 2.75 steps of 128
EXPONENTS = (0, 1, 100, 119, 127, 128, 129, 200, 250)  # 6 x 2^(250 - 127) is within bf16's range
ONE_MULTIPLY = tuple(e for e in EXPONENTS if e <= mxfp4_repacked.ONE_MULTIPLY_MAX_E8M0.value)


@triton.jit
def _decode_kernel(w_ptr, s_ptr, out_ptr, N, K, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr,
                   SWAP_AB: tl.constexpr, PAIR_FMA: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n, k] = the weight the GEMM's step tile holds for row n."""
    rows = tl.arange(0, BLOCK_N)
    row_ok = rows < N
    kk = tl.arange(0, 128)
    steps = tl.cdiv(K, 128)
    for k0 in range(0, steps * 128, 128):
        tile = mxfp4_repacked.step_tile(w_ptr, s_ptr, 0, rows, row_ok, k0, K, N, 0, 0, SCALE_HIGH, DOT_F32,
                                        SWAP_AB, PAIR_FMA).to(tl.float32)
        k = k0 + kk
        if SWAP_AB:
            tl.store(out_ptr + rows[:, None] * (steps * 128) + k[None, :], tile, mask=row_ok[:, None])
        else:
            tl.store(out_ptr + rows[None, :] * (steps * 128) + k[:, None], tile, mask=row_ok[None, :])


def _weights(device, exponents):
    g = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (1, N, K // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    packed[0, 0, :8] = torch.arange(0, 256, 0x11, dtype=torch.int32)[:8].to(torch.uint8)  # all 16 nibbles
    packed[0, 1, :8] = torch.arange(0x88, 256, 0x11, dtype=torch.int32)[:8].to(torch.uint8)
    pick = torch.randint(0, len(exponents), (1, N, K // 32), generator=g)
    e8m0 = torch.tensor(exponents, dtype=torch.uint8)[pick]
    return packed.to(device), e8m0.to(device)


def _check(device, scale_high, pair_fma=False):
    packed, e8m0 = _weights(device, EXPONENTS if scale_high else ONE_MULTIPLY)
    words, scales, holds_high = mxfp4_repacked.repack(packed, e8m0)
    assert holds_high == scale_high
    assert words.shape == (1, 3, N, 16) and scales.shape == (1, 3, N) and scales.dtype == torch.int32
    ref = dequant.mxfp4(packed.cpu(), e8m0.cpu(), torch.float64)[0]
    for swap_ab in (True, False):
        out = torch.full((N, 3 * 128), float("nan"), dtype=torch.float32, device=device)
        _decode_kernel[(1,)](words, scales, out, N, K, SCALE_HIGH=scale_high, DOT_F32=device == "cpu",
                             SWAP_AB=swap_ab, PAIR_FMA=pair_fma, BLOCK_N=triton.next_power_of_2(N))
        got = out.cpu().double()
        assert torch.equal(got[:, :K], ref), f"a decoded value differs from float64 (swap_ab={swap_ab})"
        assert bool((got[:, K:] == 0).all()), "the padding past K does not decode to zeros"


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("scale_high", [True, False])
def test_decode_exact_in_interpreter(scale_high):
    _check("cpu", scale_high)


@pytest.mark.cuda
@pytest.mark.parametrize("pair_fma", [True, False])
@pytest.mark.parametrize("scale_high", [True, False])
def test_decode_exact_on_gpu(scale_high, pair_fma):
    if pair_fma and (torch.version.hip or torch.cuda.get_device_capability() < (8, 0)):
        pytest.skip("the bf16x2 FMA is NVIDIA PTX (fma.rn.bf16x2, sm_80+)")
    _check("cuda:0", scale_high, pair_fma)
