"""The bounds on what a learner reports: every report comes out inside them, with a reason per drop."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ffdl.events.reports import MAX_METRIC_NAME_LENGTH, MAX_METRICS, MAX_STEP, bound_metrics, bound_step

_anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=100),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)


@given(
    st.dictionaries(
        st.text(max_size=100) | st.integers(), st.floats() | st.integers() | _anything, max_size=200
    )
    | _anything
)
def test_whatever_is_reported_comes_out_inside_the_bounds_and_encodes_as_strict_json(raw: object) -> None:
    bounded = bound_metrics(raw)
    assert len(bounded.metrics) <= MAX_METRICS
    for name, value in bounded.metrics.items():
        assert 1 <= len(name) <= MAX_METRIC_NAME_LENGTH
        assert name.isprintable()
        assert math.isfinite(value)
    json.dumps(bounded.metrics, allow_nan=False)


@given(st.dictionaries(st.text(min_size=1, max_size=20).filter(str.isprintable), st.floats(), max_size=30))
def test_every_metric_is_either_kept_or_dropped_with_a_reason(raw: dict[str, float]) -> None:
    bounded = bound_metrics(raw)
    finite = {name for name, value in raw.items() if math.isfinite(value)}
    assert set(bounded.metrics) == finite
    assert len(bounded.dropped) == len(raw) - len(finite)


def test_a_diverged_loss_is_dropped_with_its_reason_and_the_other_metrics_stay() -> None:
    bounded = bound_metrics({"loss": float("nan"), "acc": 0.5, "lr": float("inf")})
    assert bounded.metrics == {"acc": 0.5}
    assert any("'loss' is not finite" in reason for reason in bounded.dropped)
    assert any("'lr' is not finite" in reason for reason in bounded.dropped)


def test_forty_thousand_metrics_are_cut_to_the_first_in_name_order_with_one_reason() -> None:
    bounded = bound_metrics({f"m{index:05d}": 1.0 for index in range(40_000)})
    assert list(bounded.metrics) == [f"m{index:05d}" for index in range(MAX_METRICS)]
    assert bounded.dropped == (f"{40_000 - MAX_METRICS} metrics over the limit of {MAX_METRICS} dropped",)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"x" * (MAX_METRIC_NAME_LENGTH + 1): 1.0}, "is not 1 to"),
        ({"": 1.0}, "is not 1 to"),
        ({"a\nb": 1.0}, "unprintable"),
        ({"flag": True}, "is not a number"),
        ({"text": "1.0"}, "is not a number"),
        ({"huge": 10**30}, "too large"),
        ([1, 2], "not a mapping"),
    ],
)
def test_each_kind_of_bad_metric_is_named_in_its_reason(raw: object, reason: str) -> None:
    bounded = bound_metrics(raw)
    assert bounded.metrics == {}
    assert len(bounded.dropped) == 1
    assert reason in bounded.dropped[0]


def test_no_metrics_is_no_metrics_and_no_reason() -> None:
    assert bound_metrics(None).metrics == {}
    assert bound_metrics(None).dropped == ()


@pytest.mark.parametrize("step", [0, 1, MAX_STEP])
def test_a_step_in_range_is_kept(step: int) -> None:
    assert bound_step(step) == step


@pytest.mark.parametrize("step", [-1, MAX_STEP + 1, 10**23, 1.5, "7", True, None])
def test_a_step_out_of_range_or_not_an_integer_is_refused(step: object) -> None:
    with pytest.raises(ValueError, match="step"):
        bound_step(step)
