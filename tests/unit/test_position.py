"""The ``PARTITION:OFFSET`` token, written and read in one place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ffdl.events.position import Position


@given(partition=st.integers(0, 10_000), offset=st.integers(0, 2**63))
def test_a_token_reads_back_as_the_position_it_was_written_from(partition: int, offset: int) -> None:
    position = Position("ffdl.events", partition, offset)
    assert Position.parse("ffdl.events", position.token) == position
    assert Position.format_token(partition, offset) == position.token == f"{partition}:{offset}"


@pytest.mark.parametrize("token", ["", "3", "3:", ":4", "-1:4", "3:x", "3:4:5", None, 34])
def test_anything_else_is_refused(token: object) -> None:
    with pytest.raises(ValueError, match="position must look like PARTITION:OFFSET"):
        Position.parse_token(token)
