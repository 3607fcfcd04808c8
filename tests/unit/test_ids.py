"""Deterministic ids stay what they were: ids already on the log must come out the same after an upgrade."""

from __future__ import annotations

import uuid

from ffdl.events.ids import derived_id, pod_ended_command_id, reaction_command_id


def test_the_ids_already_on_the_log_are_derived_as_before() -> None:
    # Pinned values: the first is the first event id of tests/golden/happy_path.events.jsonl.
    submit = uuid.UUID("09cf1004-c5a7-5625-8ce9-ee08795eaef6")
    assert derived_id(submit, "owner@ffdl-0", 0) == uuid.UUID("b5d6bcdc-708e-522e-92f3-88d8fbbe9e1b")
    assert reaction_command_id("job-1", "begin-launch", 1, 5) == uuid.UUID(
        "4a42803f-ee43-5970-b295-0afc63061a11"
    )
    assert pod_ended_command_id("pod-uid-1") == uuid.UUID("0130291f-2e50-5649-9209-59183ad95117")


def test_each_part_of_what_identifies_a_thing_changes_its_id() -> None:
    ids = {
        reaction_command_id("job-1", "begin-launch", 1, 5),
        reaction_command_id("job-2", "begin-launch", 1, 5),
        reaction_command_id("job-1", "launch", 1, 5),
        reaction_command_id("job-1", "begin-launch", 2, 5),
        reaction_command_id("job-1", "begin-launch", 1, 6),
        pod_ended_command_id("pod-uid-1"),
        pod_ended_command_id("pod-uid-2"),
    }
    assert len(ids) == 7
