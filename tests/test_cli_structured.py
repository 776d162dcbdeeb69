"""``fly-cpp generate`` with --grammar / --grammar-file / --json-schema / --json-schema-file."""

from __future__ import annotations

import json
import re

import jsonschema

from test_cli_generate import fly, one_line_error

WORDS = 'root ::= [a-z]+ (" " [a-z]+)*'
SCHEMA = {"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]}, "n": {"type": "integer"}},
          "required": ["pet", "n"], "additionalProperties": False}


def text(*args: str) -> str:
    r = fly("generate", "-p", "Once upon a time", "-n", "200", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["text"]


def test_grammar_and_json_schema_options(tmp_path):
    assert re.fullmatch(r"[a-z]+( [a-z]+)*", text("--grammar", WORDS, "-n", "30", "--temp", "0"))
    (tmp_path / "words.gbnf").write_text(WORDS)
    assert re.fullmatch(r"[a-z]+( [a-z]+)*", text("--grammar-file", str(tmp_path / "words.gbnf"), "-n", "30", "--temp", "0"))
    jsonschema.validate(json.loads(text("--json-schema", json.dumps(SCHEMA), "--mode", "spd", "--temp", "0")), SCHEMA)
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    jsonschema.validate(json.loads(text("-jf", str(tmp_path / "s.json"), "--temp", "0.8", "-s", "3")), SCHEMA)


def test_bad_constraints_are_one_line_errors(tmp_path):
    assert "invalid grammar" in one_line_error(fly("generate", "-p", "a", "--grammar", "root ::= ("))
    assert "invalid JSON schema" in one_line_error(fly("generate", "-p", "a", "--json-schema", "{bad"))
    assert "cannot read grammar file" in one_line_error(fly("generate", "-p", "a", "--grammar-file", str(tmp_path / "no")))
