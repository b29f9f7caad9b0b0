"""The highest rate at a latency bound read off a sweep, and its elasticity."""

from __future__ import annotations

import math

import pytest
from pagedrs.plan.metrics import rate_at_bound


def test_crossing_and_elasticity_by_hand() -> None:
    """The crossing is interpolated between the last rate under the bound and
    the first over it; the elasticity is that segment's slope times bound /
    crossing."""
    # 0.16 s at 3 req/s, 0.21 s at 6: 0.1826 s is crossed at 3 + 3 * 0.0226 / 0.05
    found = rate_at_bound([1, 3, 6, 10], [0.10, 0.16, 0.21, 0.30], 0.1826)
    assert found["flag"] == ""
    assert found["rate"] == pytest.approx(4.356)
    assert found["elasticity"] == pytest.approx(3 / 0.05 * 0.1826 / 4.356)


def test_flat_curve_is_elastic() -> None:
    """Two sweeps crossing the bound at the same rate: the flatter one's
    crossing moves several percent per percent of latency; 5% more latency
    at every rate moves the flat sweep's rate by about its elasticity x 5%."""
    steep = rate_at_bound([2, 4], [0.10, 0.30], 0.20)
    flat = rate_at_bound([2, 4], [0.18, 0.22], 0.20)
    assert steep["rate"] == pytest.approx(3.0) and flat["rate"] == pytest.approx(3.0)
    assert steep["elasticity"] == pytest.approx(2 / 0.2 * 0.2 / 3)  # 0.67
    assert flat["elasticity"] == pytest.approx(2 / 0.04 * 0.2 / 3)  # 3.3
    slower = rate_at_bound([2, 4], [0.18 * 1.05, 0.22 * 1.05], 0.20)
    assert slower["rate"] == pytest.approx(2 + 2 * (0.20 - 0.189) / 0.042)
    assert (slower["rate"] - 3.0) / 3.0 == pytest.approx(-0.159, abs=1e-3)


def test_no_crossing() -> None:
    """Over the bound at the lowest rate: 0; under it everywhere: the highest rate."""
    over = rate_at_bound([1, 2], [0.3, 0.4], 0.2)
    assert (over["rate"], over["flag"]) == (0.0, "<") and math.isnan(over["elasticity"])
    under = rate_at_bound([1, 2], [0.1, 0.15], 0.2)
    assert (under["rate"], under["flag"]) == (2, ">=") and math.isnan(under["elasticity"])


def test_bad_sweeps_are_refused() -> None:
    with pytest.raises(ValueError, match="2 rates but 3 latencies"):
        rate_at_bound([1, 2], [0.1, 0.2, 0.3], 0.2)
    with pytest.raises(ValueError, match="rates must ascend"):
        rate_at_bound([2, 1], [0.1, 0.2], 0.2)
