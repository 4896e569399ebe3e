"""The inlined result schema reports exactly what jsonschema's own ``$ref`` resolution does."""

from __future__ import annotations

import copy
import json

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from pytest_afd.results import documents
from pytest_afd.results.schema_refs import RecursiveSchemaError, inline_refs, inlined_schema
from tests.support.study_data import make_case


def _resolving_validator() -> Draft202012Validator:
    """The reference: the schemas as written, every ``$ref`` resolved by ``referencing``."""
    manifest = documents.load_schema(documents.MANIFEST_SCHEMA_FILE)
    registry = Registry().with_resource(manifest["$id"], Resource.from_contents(manifest))
    return Draft202012Validator(documents.load_schema(documents.RESULT_SCHEMA_FILE),
                                registry=registry)


def _errors(validator, doc) -> list[tuple[tuple, str]]:
    return sorted((tuple(map(str, e.absolute_path)), e.message) for e in validator.iter_errors(doc))


def _mutations(doc):
    """Documents each wrong in one place: a type, an enum, a missing key, an extra top-level key,
    a negative count inside the per-step records, the embedded manifest."""
    def changed(edit):
        bad = copy.deepcopy(doc)
        edit(bad)
        return bad
    yield changed(lambda d: d.__setitem__("case_kind", 7))
    yield changed(lambda d: d["settings"].__setitem__("split_policy", "no_such_policy"))
    yield changed(lambda d: d.pop("metrics"))
    yield changed(lambda d: d.__setitem__("unexpected_top_level_key", 1))
    yield changed(lambda d: d["evidence"]["steps"][0].__setitem__("split_token", -3))
    yield changed(lambda d: d["manifest"]["run"].__setitem__("num_layers", "ten"))
    yield changed(lambda d: d["manifest"].pop("run"))


def test_inlined_result_schema_holds_no_reference():
    flat = inlined_schema(documents.load_schema(documents.RESULT_SCHEMA_FILE),
                          {"urn:pytest-afd:schema:manifest":
                           documents.load_schema(documents.MANIFEST_SCHEMA_FILE)})
    assert "$ref" not in json.dumps(flat)


def test_inlined_validation_reports_the_same_errors_as_resolving_references():
    doc = make_case("uniform/fixed", "token_balanced", imbalance=0.2)
    reference, inlined = _resolving_validator(), documents._validator(documents.RESULT_SCHEMA_FILE)
    assert _errors(reference, doc) == [] == _errors(inlined, doc)
    seen = 0
    for bad in _mutations(doc):
        expected = _errors(reference, bad)
        assert expected, "each mutation must break the document"
        assert _errors(inlined, bad) == expected
        seen += 1
    assert seen == 7


def test_validate_result_still_names_the_bad_path():
    doc = make_case("uniform/fixed", "token_balanced", imbalance=0.2)
    doc["evidence"]["steps"][0]["split_token"] = -3
    with pytest.raises(documents.ResultValidationError, match=r"/evidence/steps"):
        documents.validate_result(doc)


def test_a_recursive_reference_is_refused_by_name():
    schema = {"$defs": {"node": {"properties": {"next": {"$ref": "#/$defs/node"}}}},
              "$ref": "#/$defs/node"}
    with pytest.raises(RecursiveSchemaError, match="#/\\$defs/node"):
        inline_refs(schema, schema, {})


def test_a_reference_beside_other_keywords_keeps_both():
    schema = {"$defs": {"count": {"type": "integer"}},
              "properties": {"n": {"$ref": "#/$defs/count", "minimum": 2}}}
    validator = Draft202012Validator(inlined_schema(schema, {}))
    assert validator.is_valid({"n": 3})
    assert not validator.is_valid({"n": 1})
    assert not validator.is_valid({"n": "3"})
