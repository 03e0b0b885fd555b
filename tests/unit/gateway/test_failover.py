"""The failover decisions as tables: each worker failure in, one plain decision out."""

from __future__ import annotations

from dataclasses import replace

import grpc
import pytest

from homing.gateway.failover import (
    FAIL,
    MAX_MIGRATIONS,
    MIGRATE,
    RETRY,
    Decision,
    StreamState,
    WorkerFailure,
    before_first_byte,
    classify,
    mid_stream,
)


@pytest.mark.parametrize(
    ("code", "transport", "expected"),
    [
        ("UNAVAILABLE", True, WorkerFailure(retryable=True, refused=False, reported=True)),
        ("CANCELLED", False, WorkerFailure(retryable=True, refused=False, reported=False)),
        ("ABORTED", False, WorkerFailure(retryable=True, refused=False, reported=False)),
        ("RESOURCE_EXHAUSTED", False, WorkerFailure(retryable=True, refused=True, reported=False)),
        # our own whole-request deadline says nothing about the worker's health
        ("DEADLINE_EXCEEDED", True, WorkerFailure(retryable=False, refused=False, reported=False)),
        ("INTERNAL", True, WorkerFailure(retryable=False, refused=False, reported=True)),
        ("INVALID_ARGUMENT", False, WorkerFailure(retryable=False, refused=False, reported=False)),
    ],
)
def test_each_engine_status_reads_as_retryable_refused_or_reported(
    code: str, transport: bool, expected: WorkerFailure
) -> None:
    """Only a worker that went away or is full is retried; only a broken call that is not
    our own deadline counts against the worker's health; a full worker is no failing one."""
    assert code in grpc.StatusCode.__members__
    assert classify(code, transport=transport) == expected


@pytest.mark.parametrize(
    ("interrupted", "retries", "max_retries", "expected"),
    [
        (False, 0, 2, RETRY),
        (False, 1, 2, RETRY),
        (False, 2, 2, Decision("fail", counter="retry", outcome="max_retries")),
        (False, 0, 0, Decision("fail", counter="retry", outcome="max_retries")),
        (True, 0, 2, FAIL),  # the gateway ended it: nothing counted
    ],
)
def test_a_failure_before_the_first_byte_is_retried_within_max_retries(
    interrupted: bool, retries: int, max_retries: int, expected: Decision
) -> None:
    """Before anything reached the client, a retryable failure is retried until the
    request has had `max_retries` retries."""
    decision = before_first_byte(interrupted=interrupted, retries=retries, max_retries=max_retries)
    assert decision == expected


STREAM = StreamState(
    migrates=True,
    interrupted=False,
    constrained=False,
    logprobs=False,
    migrations=0,
    retries=0,
    max_retries=2,
    silent_since_migration=False,
    resume_tokens=100,
    max_prompt_tokens=1000,
)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, MIGRATE),
        ({"migrates": False}, FAIL),
        ({"interrupted": True}, FAIL),
        ({"interrupted": True, "constrained": True}, FAIL),
        ({"constrained": True}, Decision("fail", counter="migration", outcome="constrained")),
        ({"logprobs": True}, Decision("fail", counter="migration", outcome="logprobs")),
        (
            {"constrained": True, "logprobs": True},
            Decision("fail", counter="migration", outcome="constrained"),
        ),
        (
            {"migrations": MAX_MIGRATIONS},
            Decision("fail", counter="migration", outcome="max_migrations"),
        ),
        ({"resume_tokens": 1001}, Decision("fail", counter="migration", outcome="too_long")),
        ({"resume_tokens": 1000}, MIGRATE),
        # the replica it migrated to failed before its first token: a retry of the migration
        ({"migrations": 1, "silent_since_migration": True}, RETRY),
        (
            {"migrations": 1, "silent_since_migration": True, "retries": 2},
            Decision("fail", counter="retry", outcome="max_retries"),
        ),
        (
            {"migrations": 1, "silent_since_migration": True, "resume_tokens": 5000},
            RETRY,  # the prompt it resumed with was already accepted
        ),
    ],
)
def test_a_stream_failing_mid_way_migrates_once_unless_a_rule_refuses(
    change: dict[str, object], expected: Decision
) -> None:
    """After the first byte a stream migrates once, never when constrained or reporting
    log probabilities, and only while its resumed prompt fits; a silent new replica is
    retried within `max_retries`."""
    assert mid_stream(replace(STREAM, **change)) == expected  # type: ignore[arg-type]
