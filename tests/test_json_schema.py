"""JSON schemas through every mode (stories260K pair): every answer parses and validates.

Strings carry a maxLength and arrays a maxItems so that a tiny story model, which would write a
story inside any open string, still ends its answer."""

from __future__ import annotations

import json

import jsonschema
import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings

S = {"type": "string", "maxLength": 10}
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"pet": {"enum": ["cat", "dog", "bird"]}}, "required": ["pet"],
     "additionalProperties": False},
    {"type": "object", "properties": {"name": S, "age": {"type": "integer"}}, "required": ["name", "age"],
     "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}}, "required": ["tags"],
     "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer"}, "name": S},
                                               "required": ["id", "name"], "additionalProperties": False}},
     "required": ["user"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "boolean"}}, "required": ["c"], "additionalProperties": False}}, "required": ["b"],
        "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"enum": ["yes", "no"]},
    {"const": "fixed"},
    {"type": "integer"},
    {"type": "string", "maxLength": 8},
    {"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}, "score": {"enum": [1, 2, 3, 4, 5]}},
     "required": ["mood", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
        "n": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["n", "ok"], "additionalProperties": False},
        "maxItems": 2}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}}, "required": ["v"],
     "additionalProperties": False},
    {"type": "object", "properties": {"note": {"anyOf": [S, {"type": "null"}]}}, "required": ["note"],
     "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"],
     "additionalProperties": False},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"enum": ["x", "y"]}], "items": False},
]
PROMPTS = ["Once upon a time", "The little dog was sad because", "Mom said,"]


@pytest.fixture(scope="module")
def engine(stories, stories_draft):
    with Engine(ModelSettings(str(stories), n_ctx=512), ModelSettings(str(stories_draft))) as e:
        yield e


@pytest.mark.parametrize("mode", ["fly", "spd", "target"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_answer_parses_and_validates(engine, mode, temperature):
    spec = SpecSettings(mode=mode, k=8, loosen="on") if mode == "fly" else SpecSettings(mode=mode, k=8)
    for i, schema in enumerate(SCHEMAS):
        sampling = SamplingSettings(temperature=temperature, seed=i, json_schema=json.dumps(schema))
        gen = engine.generate(PROMPTS[i % len(PROMPTS)], spec=spec, sampling=sampling, max_tokens=300).run()
        assert gen.finish_reason == "stop", (schema, gen.text)
        jsonschema.validate(json.loads(gen.text), schema)


def test_any_json_object(engine):
    gen = engine.generate(PROMPTS[0], sampling=SamplingSettings(json_schema="{}"), max_tokens=40).run()
    assert gen.text.lstrip().startswith("{")
