"""The repacked 4-bit layouts (backends/triton_moe/repacked_words.py) decoded by the GEMMs' own step
tile (repacked_step), in both operand orders, on a K that is not a multiple of the 128-wide step,
with the padding decoding to zeros. In the interpreter on CPU (fp32 tiles) and on a CUDA GPU
(16-bit tiles, scaled by fp32 multiplies and by packed 16-bit FMAs).

- mxfp4: every e2m1 nibble under e8m0 exponents from 0 to 250 (above 128 the scale takes two
  multiplies), and from 0 to 128 with the one-multiply build, lands at its k bit for bit equal to
  the float64 dequantization.
- int4: every uint4b8 nibble times bf16 and fp16 group scales (per 128 values of K, and one per
  column) lands at its k as the float64 `(q - 8) * s`, exact in fp32 and, from the packed FMAs,
  rounded once to the scales' dtype (the dot's operand)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hal.backends.reference import dequant
from hal.backends.triton_moe import int4_repacked, mxfp4_repacked, repacked_step

N, K = 24, 352  # 2.75 steps of 128
EXPONENTS = (0, 1, 100, 119, 127, 128, 129, 200, 250)  # 6 x 2^(250 - 127) is within bf16's range
ONE_MULTIPLY = tuple(e for e in EXPONENTS if e <= mxfp4_repacked.ONE_MULTIPLY_MAX_E8M0.value)
INT4_K = 384  # int4 with a scale per 128 values: K is whole groups


@triton.jit
def _decode_kernel(w_ptr, s_ptr, out_ptr, N, K, INT4: tl.constexpr, HALF: tl.constexpr,
                   SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr,
                   PAIR_FMA: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n, k] = the weight the GEMM's step tile holds for row n."""
    rows = tl.arange(0, BLOCK_N)
    row_ok = rows < N
    kk = tl.arange(0, 128)
    steps = tl.cdiv(K, 128)
    for k0 in range(0, steps * 128, 128):
        tile = repacked_step.step_tile(w_ptr, s_ptr, 0, rows, row_ok, k0, N, 0, 0, INT4, HALF, SCALE_HIGH,
                                       DOT_F32, SWAP_AB, PAIR_FMA).to(tl.float32)
        k = k0 + kk
        if SWAP_AB:
            tl.store(out_ptr + rows[:, None] * (steps * 128) + k[None, :], tile, mask=row_ok[:, None])
        else:
            tl.store(out_ptr + rows[None, :] * (steps * 128) + k[:, None], tile, mask=row_ok[None, :])


def _decoded(words, scales, k, device, int4, half=torch.bfloat16, scale_high=False, pair_fma=False):
    """[N, steps * 128] float64: every operand order's decode, checked equal to each other."""
    steps = triton.cdiv(k, 128)
    outs = []
    for swap_ab in (True, False):
        out = torch.full((N, steps * 128), float("nan"), dtype=torch.float32, device=device)
        _decode_kernel[(1,)](words, scales, out, N, k, INT4=int4,
                             HALF=tl.float16 if half == torch.float16 else tl.bfloat16, SCALE_HIGH=scale_high,
                             DOT_F32=device == "cpu", SWAP_AB=swap_ab, PAIR_FMA=pair_fma,
                             BLOCK_N=triton.next_power_of_2(N))
        outs.append(out.cpu().double())
    assert torch.equal(outs[0], outs[1]), "the two operand orders decode differently"
    return outs[0]


def _mxfp4_weights(device, exponents):
    g = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (1, N, K // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    packed[0, 0, :8] = torch.arange(0, 256, 0x11, dtype=torch.int32)[:8].to(torch.uint8)  # all 16 nibbles
    packed[0, 1, :8] = torch.arange(0x88, 256, 0x11, dtype=torch.int32)[:8].to(torch.uint8)
    pick = torch.randint(0, len(exponents), (1, N, K // 32), generator=g)
    e8m0 = torch.tensor(exponents, dtype=torch.uint8)[pick]
    return packed.to(device), e8m0.to(device)


def _check_mxfp4(device, scale_high, pair_fma=False):
    packed, e8m0 = _mxfp4_weights(device, EXPONENTS if scale_high else ONE_MULTIPLY)
    words, scales, holds_high = mxfp4_repacked.repack(packed, e8m0)
    assert holds_high == scale_high
    assert words.shape == (1, 3, N, 16) and scales.shape == (1, 3, N) and scales.dtype == torch.int32
    ref = dequant.mxfp4(packed.cpu(), e8m0.cpu(), torch.float64)[0]
    got = _decoded(words, scales, K, device, False, scale_high=scale_high, pair_fma=pair_fma)
    assert torch.equal(got[:, :K], ref), "a decoded value differs from float64"
    assert bool((got[:, K:] == 0).all()), "the padding past K does not decode to zeros"


def _check_int4(device, half, per_channel, pair_fma=False):
    k = K if per_channel else INT4_K
    g = torch.Generator().manual_seed(1)
    qweight = torch.randint(-2**31, 2**31, (1, k // 8, N), generator=g, dtype=torch.int64).to(torch.int32)
    qweight[0, :2, 0] = torch.tensor([0x76543210, -0x01234568 - 1], dtype=torch.int32)  # all 16 nibbles
    groups = 1 if per_channel else k // 128
    # Scales over a wide range of exponents, each with a full 16-bit mantissa.
    scales = (torch.rand(1, groups, N, generator=g) + 0.5) * 2.0 ** torch.randint(-12, 8, (1, groups, N),
                                                                               generator=g)
    scales = scales.to(half)
    words, pairs = int4_repacked.repack(qweight.to(device), scales.to(device))
    assert words.shape == (1, 3, N, 16) and pairs.shape == (1, 3, N) and pairs.dtype == torch.int32
    exact = dequant.uint4b8(qweight, scales, torch.float64)[0]
    ref = exact.to(half).double() if pair_fma else exact  # else fp32, exact until the dot's conversion
    got = _decoded(words, pairs, k, device, True, half=half, pair_fma=pair_fma)
    assert torch.equal(got[:, :k], ref), "a decoded value differs from (q - 8) * s rounded once"
    assert bool((got[:, k:] == 0).all()), "the padding past K does not decode to zeros"


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("scale_high", [True, False])
def test_mxfp4_exact_in_interpreter(scale_high):
    _check_mxfp4("cpu", scale_high)


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_int4_exact_in_interpreter(half, per_channel):
    _check_int4("cpu", half, per_channel)


def _skip_without_pair_fma(pair_fma):
    if pair_fma and (torch.version.hip or torch.cuda.get_device_capability() < (8, 0)):
        pytest.skip("the packed 16-bit FMAs are NVIDIA PTX (fma.rn.bf16x2, sm_80+)")


@pytest.mark.cuda
@pytest.mark.parametrize("pair_fma", [True, False])
@pytest.mark.parametrize("scale_high", [True, False])
def test_mxfp4_exact_on_gpu(scale_high, pair_fma):
    _skip_without_pair_fma(pair_fma)
    _check_mxfp4("cuda:0", scale_high, pair_fma)


@pytest.mark.cuda
@pytest.mark.parametrize("pair_fma", [True, False])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_int4_on_gpu(half, per_channel, pair_fma):
    _skip_without_pair_fma(pair_fma)
    _check_int4("cuda:0", half, per_channel, pair_fma)
