"""The one ratio convention (timing.py): "N.NNx faster" = baseline time / our time, the median of the per-round
ratios with their quartiles; a ratio that disagrees with the ratio of the medians beside it says so, and why."""

from __future__ import annotations

import statistics

import pytest

from kernel_hub.verify.timing import RATIO_CONVENTION, Ratio, format_ratio, ratio_disagreement


def test_the_convention_is_baseline_over_ours():
    r = Ratio.of([4.0, 4.0, 4.0], [2.0, 2.0, 2.0])  # baseline twice as slow: ours 2x faster
    assert (r.value, r.of_medians) == (2.0, 2.0)
    assert format_ratio(r) == "2.00x faster (2.00-2.00)"
    assert "baseline time / our time" in RATIO_CONVENTION


def test_the_benchs_quick_run_is_flagged():
    """bench --quick: ours 2.98 ms vs lax 1.86 ms medians beside per-round ratios 0.35, 3.25, 2.74."""
    ours = [2.98, 1.0, 3.10]
    lax = [0.35 * 2.98, 3.25 * 1.0, 2.74 * 3.10]
    r = Ratio.of(lax, ours)
    per_round = sorted(b / o for b, o in zip(lax, ours, strict=True))
    assert r.value == pytest.approx(statistics.median(per_round))
    assert r.of_medians == pytest.approx(statistics.median(lax) / statistics.median(ours))
    text = format_ratio(r)
    assert text.startswith(f"{r.value:.2f}x faster") and f"{r.of_medians:.2f}x" in text
    assert "one says faster, the other slower" in text or "differ by" in text


@pytest.mark.parametrize(("value", "of_medians", "flagged", "why"), [
    (2.74, 0.62, True, "one says faster, the other slower"),
    (0.9, 1.1, True, "one says faster, the other slower"),
    (2.01, 3.66, True, "differ by 45%"),  # the demo: grouped_mm 2400 ms, kernelized 655.9 ms beside 2.01x
    (2.0, 2.4, False, None),            # 17% apart, same side
    (3.0, 3.0, False, None),
    (1.0, 1.4, True, "differ by 29%"),    # 1.0 is on neither side; 1/1.4 is 29% off
    (1.0, 1.3, False, None),            # 23% off: within the tolerance
    (2.0, None, False, None),           # nothing recorded to compare with
])
def test_ratio_disagreement(value, of_medians, flagged, why):
    note = ratio_disagreement(value, of_medians)
    assert (note is not None) == flagged
    if flagged:
        assert why in note and f"{of_medians:.2f}x" in note


def test_an_old_record_without_the_medians_ratio_still_formats():
    assert format_ratio({"value": 10.5, "low": 9.8, "high": 11.2, "paired": True}) == "10.5x faster (9.8-11.2)"
    assert format_ratio(None) == "-"
