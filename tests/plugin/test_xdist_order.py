"""Known-long cases first under xdist, collection order otherwise (``run/xdist_order``)."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_afd.run.xdist_order import long_cases_first


def _items(*names: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(originalname=name, nodeid=f"{name}[{index}]")
            for index, name in enumerate(names)]


def test_named_cases_move_to_the_front_in_the_order_given_the_rest_keep_theirs():
    items = _items("a", "soak", "b", "memory", "c", "soak")
    ordered = long_cases_first(items, ("soak", "memory"))
    assert [item.nodeid for item in ordered] == [
        "soak[1]", "soak[5]", "memory[3]", "a[0]", "b[2]", "c[4]"]


def test_no_named_case_leaves_the_order_unchanged():
    items = _items("a", "b", "c")
    assert long_cases_first(items, ("soak",)) == items
    assert long_cases_first(items, ()) == items

