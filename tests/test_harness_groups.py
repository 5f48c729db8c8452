"""The suite's own rules (``tests/conftest.py``): tests that read a fixture their module
makes once share one ``xdist_group`` -- the module -- so that under ``-n`` one worker
makes it once; a test that reads none is left free. A case its module marks
``exhaustive`` is ``slow`` (out of the fast tier) and not ``unit``."""

from __future__ import annotations

import pytest

made: list[int] = []


@pytest.fixture(scope="module")
def made_once():
    made.append(1)
    return len(made)


def _groups(request) -> list[str]:
    return [m.args[0] for m in request.node.iter_markers("xdist_group")]


def test_a_reader_of_a_module_fixture_joins_its_modules_group(made_once, request):
    assert _groups(request) == ["tests/test_harness_groups.py"]


def test_a_second_reader_joins_the_same_group_and_sees_the_same_value(made_once, request):
    assert _groups(request) == ["tests/test_harness_groups.py"] and made_once == 1 == len(made)


def test_a_test_without_one_is_left_free(tmp_path, request):
    assert _groups(request) == []


@pytest.mark.exhaustive
def test_an_exhaustive_case_is_slow_and_not_unit(request):
    marks = {m.name for m in request.node.iter_markers()}
    assert {"exhaustive", "slow"} <= marks and not marks & {"unit", "multiprocess"}, marks


def test_an_ordinary_one_process_test_is_unit_and_in_the_fast_tier(request):
    marks = {m.name for m in request.node.iter_markers()}
    assert "unit" in marks and not marks & {"slow", "exhaustive"}, marks
