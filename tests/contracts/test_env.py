"""contracts/env.py: an unset variable gives the typed default, a set one its parsed value, a bad one
an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.env import env_bool, env_float, env_int, env_list, env_path, env_str

NAME = "MOTLEY_TEST_ONLY_VARIABLE"


def test_unset_gives_the_default_as_its_type(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_str(NAME, "x") == "x"
    assert env_int(NAME, 3) == 3 and isinstance(env_float(NAME, 15), float)
    assert env_bool(NAME, True) is True
    assert env_path(NAME, "/srv") == Path("/srv")
    assert env_list(NAME, "a, b,,c") == ("a", "b", "c")


def test_set_values_are_parsed(monkeypatch):
    monkeypatch.setenv(NAME, "7")
    assert env_int(NAME, 3) == 7 and env_float(NAME, 1.0) == 7.0 and env_str(NAME, "") == "7"
    for word, value in [("1", True), ("Yes", True), ("ON", True), ("0", False), ("no", False)]:
        monkeypatch.setenv(NAME, word)
        assert env_bool(NAME, not value) is value
    monkeypatch.setenv(NAME, "/a:/b")
    assert env_list(NAME, "", sep=":") == ("/a", "/b")
    monkeypatch.setenv(NAME, "")
    assert env_path(NAME, "/srv") == Path("/srv") and env_list(NAME, "x") == ()


def test_a_value_that_does_not_parse_is_an_error_not_the_default(monkeypatch):
    monkeypatch.setenv(NAME, "fifteen")
    with pytest.raises(ValueError):
        env_float(NAME, 15.0)
    with pytest.raises(ValueError):
        env_int(NAME, 15)
