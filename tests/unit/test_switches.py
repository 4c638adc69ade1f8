"""The environment switches' readers: defaults, accepted values, refusals by name."""

import re

import pytest

from vllm_specextend.config.switches import env_choice, env_count, env_flag

NAME = "SPECEXTEND_TEST_SWITCH"


@pytest.mark.parametrize("value, want",
                         [(None, "a"), ("", "a"), ("a", "a"), ("b", "b")])
def test_a_choice_is_its_default_or_the_other(monkeypatch, value, want):
    if value is not None:
        monkeypatch.setenv(NAME, value)
    assert env_choice(NAME, "a", "b") == want


def test_a_choice_refuses_a_third_value_by_name(monkeypatch):
    monkeypatch.setenv(NAME, "c")
    said = f"{NAME}='c': use 'a' \\(the default\\) or 'b'"
    with pytest.raises(ValueError, match=said):
        env_choice(NAME, "a", "b")


@pytest.mark.parametrize("value, want", [(None, False), ("0", False), ("1", True)])
def test_a_flag_is_off_unless_one(monkeypatch, value, want):
    if value is not None:
        monkeypatch.setenv(NAME, value)
    assert env_flag(NAME, "on") is want


@pytest.mark.parametrize("value", ["yes", "true", "2"])
def test_a_flag_refuses_what_is_not_0_or_1(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    with pytest.raises(ValueError, match=r"use 1 \(on\) or 0 \(the default\)"):
        env_flag(NAME, "on")


@pytest.mark.parametrize("value, want", [(None, 3), ("", 3), ("1", 1), ("8", 8)])
def test_a_count_within_its_bounds(monkeypatch, value, want):
    if value is not None:
        monkeypatch.setenv(NAME, value)
    assert env_count(NAME, 3, 1, 8, "tokens") == want


@pytest.mark.parametrize("value, high, said", [
    ("0", 8, "use 1 to 8 tokens (3, the default)"),
    ("9", 8, "use 1 to 8 tokens (3, the default)"),
    ("-1", None, "use 1 or more tokens (3, the default)"),
    ("x", None, "use 1 or more tokens (3, the default)"),
])
def test_a_count_refuses_what_is_out_of_bounds(monkeypatch, value, high, said):
    monkeypatch.setenv(NAME, value)
    with pytest.raises(ValueError, match=re.escape(f"{NAME}='{value}': {said}")):
        env_count(NAME, 3, 1, high, "tokens")
