"""JSON schemas through every mode (stories260K pair): every answer to the fifty schemas of
``tests/schemas.py`` ends (``stop``, not cut by max_tokens), parses and validates."""

from __future__ import annotations

import json

import jsonschema
import pytest
from schemas import SCHEMAS

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings

MAX_TOKENS = 120  # the longest answer here is about 90 tokens
PROMPTS = ["Once upon a time", "The little dog was sad because", "Mom said,"]


@pytest.fixture(scope="module")
def engine(stories, stories_draft):
    with Engine(ModelSettings(str(stories), n_ctx=512), ModelSettings(str(stories_draft))) as e:
        yield e


@pytest.mark.parametrize("mode", ["fly", "spd", "target"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_answer_parses_and_validates(engine, mode, temperature):
    spec = SpecSettings(mode=mode, k=4, loosen="on") if mode == "fly" else SpecSettings(mode=mode, k=4)
    for i, schema in enumerate(SCHEMAS):
        sampling = SamplingSettings(temperature=temperature, seed=i, json_schema=json.dumps(schema))
        gen = engine.generate(PROMPTS[i % len(PROMPTS)], spec=spec, sampling=sampling, max_tokens=MAX_TOKENS).run()
        assert gen.finish_reason == "stop", (schema, gen.text)  # ended, not cut by max_tokens
        jsonschema.validate(json.loads(gen.text), schema)


def test_any_json_object(engine):
    gen = engine.generate(PROMPTS[0], sampling=SamplingSettings(json_schema="{}"), max_tokens=40).run()
    assert gen.text.lstrip().startswith("{")
