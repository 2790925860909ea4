"""How tests/conftest.py spreads the tests over pytest-xdist workers."""

from __future__ import annotations

import pytest


def test_a_test_without_a_longer_lived_fixture_is_tied_to_no_worker(request: pytest.FixtureRequest) -> None:
    # the session fixtures every worker makes for itself (autouse) must not group every test by its module
    assert request.node.get_closest_marker("xdist_group") is None


def test_every_test_named_to_start_first_exists() -> None:
    # a renamed test would silently lose its place among the first and could again run alone at the end
    from conftest import FIRST, ROOT

    for entry in FIRST:
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        assert not name or f"def {name}(" in (ROOT / path).read_text(), entry
