"""The compiled yes/no (``fast_check``) agrees with ``jsonschema`` on every kind of damage.

A document the compiled validator wrongly called valid would be written without its
errors; one it wrongly called invalid would only cost time (``jsonschema`` then finds
nothing and the document passes). So the verdicts must be the same, both ways, on
documents damaged at every path of real results: a key dropped, a value of another type,
a number out of range or fractional, a string no enum holds, an unknown key added.
"""

from __future__ import annotations

import copy
import random

import pytest

from pytest_afd.results import documents
from pytest_afd.results.fast_check import compiled_check
from tests.support.study_data import make_case

MUTATIONS_PER_DOCUMENT = 120
SAMPLE_SEED = 20261207
REPLACEMENTS = ("not-a-known-value", -1, 0.5, 10**12, None, True, [], {})
"""Another type, out of range, fractional, unknown string, null, bool, empty containers."""
UNKNOWN_KEY = "key_no_schema_names"


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*path, index))


def _at(doc, path):
    for part in path:
        doc = doc[part]
    return doc


def _mutations(doc):
    """Every path of ``doc`` damaged each way (``REPLACEMENTS``, dropped, an unknown key)."""
    found = []
    for path in _paths(doc):
        if path:
            for value in REPLACEMENTS:
                found.append(("replace", path, value))
            if isinstance(_at(doc, path[:-1]), dict):
                found.append(("drop", path, None))
        if isinstance(_at(doc, path), dict):
            found.append(("add", path, 1))
    return found


def _apply(doc, mutation):
    kind, path, value = mutation
    bad = copy.deepcopy(doc)
    if kind == "add":
        _at(bad, path)[UNKNOWN_KEY] = value
    elif kind == "drop":
        del _at(bad, path[:-1])[path[-1]]
    else:
        _at(bad, path[:-1])[path[-1]] = value
    return bad


def _documents():
    gate = make_case("uniform/fixed", "token_balanced", imbalance=0.2, kind="gate")
    stage = make_case("bimodal/prefix", "request_boundary", imbalance=0.4, hit=0.5,
                      instrument=True, chunk_size=64)
    return {"gate": gate, "stage_c": stage}


@pytest.mark.parametrize("name", ["gate", "stage_c"])
def test_compiled_and_jsonschema_verdicts_agree_on_damage_at_every_path(name):
    check = compiled_check(documents._validator(documents.RESULT_SCHEMA_FILE).schema)
    if check is None:
        pytest.skip("jsonschema-rs is not installed: every document takes the jsonschema path")
    doc = _documents()[name]
    reference = documents._validator(documents.RESULT_SCHEMA_FILE)
    assert check(doc) and reference.is_valid(doc)
    mutations = _mutations(doc)
    sample = random.Random(SAMPLE_SEED).sample(mutations, MUTATIONS_PER_DOCUMENT)
    verdicts = {True: 0, False: 0}
    for mutation in sample:
        bad = _apply(doc, mutation)
        expected = reference.is_valid(bad)
        assert check(bad) == expected, (mutation, expected)
        verdicts[expected] += 1
    # Both verdicts are exercised: most damage breaks the document, some is still valid.
    assert verdicts[False] >= MUTATIONS_PER_DOCUMENT // 2 and verdicts[True] >= 1, verdicts


def test_an_invalid_document_still_gets_jsonschemas_errors_by_path():
    doc = make_case("uniform/fixed", "token_balanced", imbalance=0.2)
    doc["evidence"]["steps"][0]["split_token"] = -3
    doc["case_kind"] = 7
    with pytest.raises(documents.ResultValidationError) as raised:
        documents.validate_result(doc)
    assert "at /case_kind" in str(raised.value)
    assert "at /evidence" in str(raised.value)


def test_without_the_compiled_validator_every_document_takes_the_jsonschema_path(monkeypatch):
    from pytest_afd.results import fast_check

    monkeypatch.setattr(fast_check, "_compiled_module", lambda: None)
    documents._compiled_check.cache_clear()
    try:
        assert fast_check.compiled_check({"type": "object"}) is None
        doc = make_case("uniform/fixed", "token_balanced", imbalance=0.2)
        documents.validate_result(doc)
        doc["case_kind"] = 7
        with pytest.raises(documents.ResultValidationError, match="at /case_kind"):
            documents.validate_result(doc)
    finally:
        documents._compiled_check.cache_clear()
