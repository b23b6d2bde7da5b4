"""The pure parts of `hal bench`: routing skew, floors and tables."""

import pytest

from hal.bench.ceilings import Ceilings
from hal.bench.requant import skewed_rows
from hal.bench.table import table_lines

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("experts, rows, skew", [(8, 8, 1), (8, 8, 4), (8, 8, 16), (1, 5, 4),
                                                  (256, 1, 16), (7, 3, 2)])
def test_skew_keeps_the_total_and_gives_one_hot_expert(experts, rows, skew):
    masked = skewed_rows(experts, rows, skew)
    assert len(masked) == experts and sum(masked) == experts * rows
    assert masked[0] == min(skew * rows, experts * rows)
    assert max(masked[1:], default=0) - min(masked[1:], default=0) <= 1


def test_floor_is_the_largest_bound():
    c = Ceilings("cuda:0", copy_gbps=4000.0, bf16_tflops=700.0, launch_us=0.5)
    assert c.floor_s(4e6) == pytest.approx(1e-6)  # 4 MB at 4 TB/s
    assert c.floor_s(1e3) == pytest.approx(0.5e-6)  # a tiny launch is bounded by the launch
    assert c.floor_s(0, flops=7e12) == pytest.approx(10e-3)
    assert Ceilings("cpu", 20.0, 1.0).floor_s(0) == 0.0


def test_tables_align_and_render_markdown():
    head, body = ("a", "bb"), [("1", "2222"), ("333", "4")]
    text = table_lines(head, body)
    assert len({len(line) for line in text}) == 1
    md = table_lines(head, body, markdown=True)
    assert md[0] == "| a | bb |" and md[1] == "|---|---|" and md[3] == "| 333 | 4 |"
