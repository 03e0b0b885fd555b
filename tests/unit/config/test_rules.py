"""The shared value rules: the version label's three forms (predicate, check, config field)
agree, and the subsystems use the config's copy of each rule."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from homing.config import rules
from homing.config.rules import (
    MAX_VERSION_LABEL,
    VersionLabel,
    check_version_label,
    is_version_label,
)
from homing.engines import pool
from homing.rollout import plan
from homing.router import versions

LABELS = ["", " ", "v1", "~", "a" * MAX_VERSION_LABEL, "a" * (MAX_VERSION_LABEL + 1), "\x7f",
          "\x1f", "é", "v1\n", "tab\there"]  # fmt: skip


@pytest.mark.parametrize("label", LABELS)
def test_the_field_and_the_predicate_agree(label: str) -> None:
    """`VersionLabel` accepts exactly what `is_version_label` accepts."""
    try:
        TypeAdapter(VersionLabel).validate_python(label)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted is is_version_label(label)


@pytest.mark.parametrize("label", LABELS)
def test_a_named_version_is_a_label_that_is_not_empty(label: str) -> None:
    """`check_version_label` is `is_version_label` without the empty label."""
    if label and is_version_label(label):
        assert check_version_label(label) == label
    else:
        with pytest.raises(ValueError, match="1 to 128 printable ASCII characters"):
            check_version_label(label)


def test_a_label_that_is_no_string_is_none() -> None:
    """A stored label read back may be any JSON value: only a string can be a label."""
    assert not is_version_label(None)
    assert not is_version_label(5)


def test_the_subsystems_use_the_config_rules() -> None:
    """The worker pool, the rollout plan and the version split hold no copies of their
    own."""
    assert pool.check_worker_url is rules.check_worker_url
    assert plan.check_steps is rules.check_steps
    assert plan.MAX_BAKE_S is rules.MAX_BAKE_S
    assert versions.check_version_weights is rules.check_version_weights
