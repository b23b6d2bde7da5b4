"""`hal bench moe` a person can trust: ceilings with their spread across rounds, each row's
p10-p90, a warning when the machine was noisy, no roof figure above 100% passed off as real, and a
plot of time against tokens with the roofline."""

import json
import subprocess
import sys

import pytest

from hal.bench import ceilings, moe, noise
from hal.bench.ceilings import Ceilings
from hal.bench.timing import Timing

pytestmark = pytest.mark.cpu

SPEC_ARGS = ("--experts", "8", "--top-k", "2", "--hidden", "128", "--intermediate", "64",
             "--format", "fp8_block128", "--tokens", "1,4", "--backend", "reference", "--only",
             "--iters", "2", "--warmup", "1")


def test_ceilings_are_the_median_round_with_the_spread(monkeypatch):
    rounds = iter([0.2, 0.1, 0.4])  # seconds of one copy in each round
    monkeypatch.setattr(ceilings, "_copy_seconds", lambda device, nbytes: [next(rounds) for _ in range(3)])
    monkeypatch.setattr(ceilings, "_matmul_seconds", lambda device, n, **_: 1.0)
    monkeypatch.setattr(ceilings, "_cpu_matmul_n", lambda: 256)
    c = ceilings.measure("cpu")
    assert c.copy_gbps == pytest.approx(2 * ceilings.CPU_COPY_BYTES / 0.2 / 1e9)
    assert c.copy_spread == pytest.approx(4.0) and c.bf16_spread == pytest.approx(1.0)
    assert "copy" in c.describe() and "(4.00x)" in c.describe()


def test_a_noisy_machine_is_named():
    quiet = Ceilings("cpu", 20.0, 1.0, copy_spread=1.1, bf16_spread=1.05)
    assert noise.warnings_for(quiet, load=0.1) == ()
    spread = noise.warnings_for(Ceilings("cpu", 20.0, 1.0, bf16_spread=170.0), load=0.1)
    assert len(spread) == 1 and "bf16 matmul ceiling varied 170.00x" in spread[0]
    loaded = noise.warnings_for(quiet, load=3.0)
    assert len(loaded) == 1 and "3.00 runnable threads per CPU" in loaded[0]
    over = noise.warnings_for(quiet, load=None, over_roofline=2)
    assert len(over) == 1 and "2 row(s) ran faster than the ceilings allow" in over[0]


def test_the_table_shows_the_spread_and_flags_a_roof_above_100_percent():
    import hal

    spec = hal.MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)
    rows = tuple(moe.MoERow(4, "uniform", "reference", Timing(1e-3, 0.5e-3, 4e-3, 10, "wall"), 1e6, 1e6,
                            1.0, 0.001, fraction, fraction * 1e-3, None, None) for fraction in (11.99, 0.4))
    c = Ceilings("cpu", 20.0, 1.0, bf16_spread=170.0)
    result = moe.MoEBench(spec, "cpu", 2, c, None, rows, 0.1, noise.warnings_for(c, 0.1, 1))
    text = moe.format_table(result)
    assert "p10-p90 us" in text and "500.0-4000.0" in text
    assert ">100%!" in text and "1199%" not in text and "40%" in text
    assert "WARNING, a noisy machine: the bf16 matmul ceiling varied 170.00x" in text


def test_bench_json_carries_the_spreads_and_the_noise(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "hal", "bench", "moe", *SPEC_ARGS, "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    payload = json.loads(out.read_text())
    assert payload["ceilings"]["copy_spread"] >= 1.0 and payload["ceilings"]["bf16_spread"] >= 1.0
    assert isinstance(payload["noise"], list)
    assert all(r["timing"]["p10_s"] <= r["timing"]["median_s"] <= r["timing"]["p90_s"]
               for r in payload["rows"])


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    run = subprocess.run([sys.executable, "-m", "hal", "bench", "moe", *SPEC_ARGS, "--plot", str(png)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch):
    from hal.bench.plot import require_matplotlib

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(ValueError, match=r"--plot needs matplotlib.*moe-hal\[plot\]"):
        require_matplotlib()
