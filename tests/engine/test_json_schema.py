"""Structured outputs' grammar (``engine.json_schema``), checked against a small independent
validator of the same JSON Schema subset: random schemas with random instances written in their
properties' order are accepted whole (and complete only at their end); any text the grammar finds
complete, after random edits too, parses and validates; masks equal a brute-force check; what a
schema may not use is refused with its keyword and place; and on the tiny model each finished
choice validates."""

from __future__ import annotations

import dataclasses
import json
import random
import weakref

import pytest
import torch

from engine import json_grammar as g
from engine.json_masks import JsonVocabulary
from engine.json_schema import SchemaError, compile_schema
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.test_json_grammar import random_edits

# ---- an oracle: the subset's meaning, written without the grammar --------------------------------


def _resolve(schema: dict, root: dict) -> dict:
    while isinstance(schema, dict) and "$ref" in schema:
        section, name = schema["$ref"][2:].split("/", 1)
        schema = root[section][name]
    return schema


def valid(value: object, schema: object, root: dict) -> bool:  # noqa: C901, PLR0911 - one case a keyword
    if schema is True or schema == {}:
        return True
    schema = _resolve(schema, root)
    if "const" in schema:
        return json.dumps(value) == json.dumps(schema["const"])
    if "enum" in schema:
        return any(json.dumps(value) == json.dumps(e) for e in schema["enum"])
    if "anyOf" in schema:
        return any(valid(value, s, root) for s in schema["anyOf"])
    if "oneOf" in schema:
        return sum(valid(value, s, root) for s in schema["oneOf"]) == 1
    kind = schema.get("type")
    if isinstance(kind, list):
        return any(valid(value, {**schema, "type": k}, root) for k in kind)
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else None
    if kind is None:
        return True
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "array":
        if not isinstance(value, list) or len(value) < schema.get("minItems", 0):
            return False
        if schema.get("maxItems") is not None and len(value) > schema["maxItems"]:
            return False
        prefix, rest = schema.get("prefixItems", []), schema.get("items", True)
        if isinstance(rest, list):  # (drafts 4 to 7: items as a list, then additionalItems)
            prefix, rest = rest, schema.get("additionalItems", True)
        if rest is False and len(value) > len(prefix):
            return False
        return all(valid(v, prefix[i] if i < len(prefix) else rest, root) for i, v in enumerate(value))
    if not isinstance(value, dict):
        return False
    props = schema.get("properties") or {}
    if not props:  # (a map: each value of additionalProperties, so many of them)
        if not schema.get("minProperties", 0) <= len(value) <= schema.get("maxProperties", len(value)):
            return False
        return all(valid(v, schema.get("additionalProperties", True), root) for v in value.values())
    order = list(props)
    if any(k not in props for k in value) or [k for k in order if k in value] != list(value):
        return False  # (the grammar writes only the named properties, in the schema's order)
    return all(r in value for r in schema.get("required", [])) and all(
        valid(v, props[k], root) for k, v in value.items())


# ---- random schemas and instances ----------------------------------------------------------------

_NAMES = ["a", "name", "b_c", "x-y", "é", "日本", 'q"t', "back\\slash", "n1", "n12"]


def _random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "optional", "any"]
    if depth < 3:
        kinds += ["object", "object", "array", "free_object", "map", "tuple", "union", "tagged"]
    kind = rng.choice(kinds)
    if kind == "enum":
        return {"enum": rng.sample(["cat", "dog", "caterpillar", 1, 12, 1.5, True, None, [1, "a"], {"k": "v"}],
                                   rng.randint(1, 4))}
    if kind == "optional":  # (Optional[X] in pydantic: X or null)
        while True:
            alt = _random_schema(rng, depth + 1)
            if alt.get("type") in ("string", "integer", "number", "boolean", "array", "object"):
                return {"anyOf": [alt, {"type": "null"}]}
    if kind == "any":
        return {}
    if kind == "union":  # (alternatives that may start alike, overlap, or be the same: pydantic's Union)
        return {"anyOf": [_random_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    if kind == "tagged":  # (pydantic's discriminated union: a oneOf of objects told apart by a constant)
        alts = []
        for tag in rng.sample(["cat", "dog", "caterpillar", "c"], rng.randint(2, 3)):
            alt = _random_schema(rng, 3)
            names = rng.sample(_NAMES, 2)
            alts.append({"type": "object", "properties": {names[0]: alt, "kind": {"const": tag},
                                                          names[1]: _random_schema(rng, 3)},
                         "required": ["kind", *[n for n in names if rng.random() < 0.5]]})
        return {"oneOf": alts, "discriminator": {"propertyName": "kind"}}
    if kind == "free_object":
        return {"type": "object", "additionalProperties": True}
    if kind == "object":
        names = rng.sample(_NAMES, rng.randint(1, 4))
        props = {n: _random_schema(rng, depth + 1) for n in names}
        return {"type": "object", "properties": props, "required": [n for n in names if rng.random() < 0.6],
                "additionalProperties": False}
    if kind == "array":
        low = rng.randint(0, 2)
        return {"type": "array", "items": _random_schema(rng, depth + 1), "minItems": low,
                "maxItems": rng.choice([None, low, low + 2])}
    if kind == "map":  # (dict[str, X] in pydantic)
        schema = {"type": "object", "additionalProperties": _random_schema(rng, depth + 1)}
        if rng.random() < 0.5:
            schema["minProperties"] = rng.randint(0, 1)
        if rng.random() < 0.5:
            schema["maxProperties"] = rng.randint(1, 3)
        return schema
    if kind == "tuple":  # (tuple[X, Y] in pydantic: prefixItems; the draft 7 form: items as a list)
        prefix = [_random_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]
        low = rng.randint(0, len(prefix))
        rest = rng.choice([False, False, _random_schema(rng, depth + 1)])
        if rng.random() < 0.3:
            return {"type": "array", "items": prefix, "additionalItems": rest, "minItems": low}
        return {"type": "array", "prefixItems": prefix, "items": rest, "minItems": low}
    return {"type": kind, "title": "ignored", "description": "read past"}


def _instance(rng: random.Random, schema: dict, root: dict) -> object:  # noqa: PLR0911
    schema = _resolve(schema, root)
    if schema == {}:
        return rng.choice([1, "free", None, [True, {"z": -0.5}], {"k": [1, 2]}])
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    for word in ("anyOf", "oneOf"):
        if word in schema:
            return _instance(rng, rng.choice(schema[word]), root)
    kind = schema["type"]
    if kind == "string":
        return rng.choice(["", "text", 'with "quotes"', "tab\there", "é 🙂"])
    if kind == "integer":
        return rng.choice([0, -7, 123456])
    if kind == "number":
        return rng.choice([0, -7, 1.5, -2.5e-8, 1e21])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        high = schema.get("maxItems")
        prefix, rest = schema.get("prefixItems", []), schema["items"]
        if isinstance(rest, list):
            prefix, rest = rest, schema["additionalItems"]
        if rest is False:
            high = len(prefix)
        n = rng.randint(schema["minItems"], schema["minItems"] + 2 if high is None else high)
        return [_instance(rng, prefix[i] if i < len(prefix) else rest, root) for i in range(n)]
    if "properties" not in schema and isinstance(schema.get("additionalProperties"), dict):
        n = rng.randint(schema.get("minProperties", 0), schema.get("maxProperties", 3))
        return {k: _instance(rng, schema["additionalProperties"], root) for k in rng.sample(_NAMES, n)}
    if "properties" not in schema:
        return {"free": [1, {"x": None}]}
    return {k: _instance(rng, s, root) for k, s in schema["properties"].items()
            if k in schema["required"] or rng.random() < 0.5}


def _root_schema(rng: random.Random) -> dict:
    names = rng.sample(_NAMES, rng.randint(1, 4))
    schema = {"type": "object", "properties": {n: _random_schema(rng) for n in names},
              "required": [n for n in names if rng.random() < 0.7]}
    if rng.random() < 0.3:  # a definition used by reference
        schema["$defs"] = {"Thing": _random_schema(rng, 1)}
        schema["properties"]["ref"] = {"$ref": "#/$defs/Thing"}
    return schema


def _compound_enum(schema: object) -> bool:
    if isinstance(schema, dict):
        if any(isinstance(v, list | dict) for v in schema.get("enum", ())):
            return True
        return any(_compound_enum(v) for v in schema.values())
    return isinstance(schema, list) and any(_compound_enum(v) for v in schema)


def _written(rng: random.Random, value: object, schema: dict) -> str:
    if _compound_enum(schema):  # an array or object among an enum's values is written compactly
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False, indent=rng.choice([None, None, 2]),
                      separators=rng.choice([None, (",", ":")]))


def _accepts(grammar, text: bytes):  # noqa: ANN001, ANN202
    return g.accepts(text, grammar.initial, grammar.step)


def test_instances_in_schema_order_are_accepted_and_complete_only_at_their_end() -> None:
    rng = random.Random(0)
    for _ in range(400):
        schema = _root_schema(rng)
        grammar = compile_schema(json.dumps(schema))
        value = _instance(rng, schema, schema)
        assert valid(value, schema, schema), (schema, value)
        data = _written(rng, value, schema).encode()
        state = grammar.initial
        for i, b in enumerate(data):
            state = grammar.step(state, b)
            assert state is not None, (schema, data, i)
            assert not g.is_complete(state) or not data[i + 1:].strip(), (schema, data, i)
        assert g.is_complete(state), (schema, data)


def test_whatever_the_grammar_completes_validates_also_after_random_edits() -> None:
    rng = random.Random(1)
    pieces = ['"', "}", "]", ",", ":", "1", ".5", "null", "true", '"cat"', '"dog"', '"x": 1', "[", "{", " ", "e3"]
    counts = [0, 0]
    for _ in range(3_000):
        schema = _root_schema(rng)
        grammar = compile_schema(json.dumps(schema))
        text = random_edits(rng, _written(rng, _instance(rng, schema, schema), schema), pieces, rng.randint(1, 2))
        state = _accepts(grammar, text.encode())
        complete = state is not None and g.is_complete(state)
        counts[complete] += 1
        if complete:
            assert valid(json.loads(text), schema, schema), (schema, text)
    assert min(counts) > 200, counts


def _mutated(rng: random.Random, value: object) -> object:
    """``value`` with one change somewhere inside: a key dropped, added or moved, an array item
    added or dropped, or a value replaced by one of another kind."""
    if isinstance(value, dict) and value and rng.random() < 0.5:
        keys = list(value)
        change = rng.randrange(4)
        if change == 0:
            return {k: v for k, v in value.items() if k != rng.choice(keys)}
        if change == 1:
            return {**value, rng.choice(["zz", *_NAMES]): 1}
        if change == 2:
            return dict(reversed(value.items()))
        key = rng.choice(keys)
        return {**value, key: _mutated(rng, value[key])}
    if isinstance(value, list) and value and rng.random() < 0.5:
        change = rng.randrange(3)
        if change == 0:
            return value[:-1]
        if change == 1:
            return [*value, value[0]]
        i = rng.randrange(len(value))
        return value[:i] + [_mutated(rng, value[i])] + value[i + 1:]
    return rng.choice([0, 2.5, "s", "cat", True, None, [], {}, [1], {"a": 1}, 12])


def test_changed_instances_are_complete_exactly_when_they_validate() -> None:
    """Instances changed as values (then written out): the grammar completes one exactly when the
    oracle finds it valid (properties in the schema's order, no others, the required ones there)."""
    rng = random.Random(3)
    counts = [0, 0]
    for _ in range(3_000):
        schema = _root_schema(rng)
        grammar = compile_schema(json.dumps(schema))
        value = _mutated(rng, _instance(rng, schema, schema))
        state = _accepts(grammar, _written(rng, value, schema).encode())
        ok = valid(value, schema, schema)
        assert (state is not None and g.is_complete(state)) == ok, (schema, value)
        counts[ok] += 1
    assert min(counts) > 300, counts


@pytest.mark.parametrize(("schema", "words", "unsupported"), [
    ({"type": "string"}, "root must be an object", True),
    ({"type": "array", "items": {}}, "root must be an object", True),
    ({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 5}}}, "'multipleOf' is only supported "
     "on integers (at schema.properties.a)", True),
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}, "'uniqueItems' is not supported "
     "(at schema.properties.a)", True),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "color"}}}, "format 'color'", True),
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "integer"}, {"minimum": 1}]}}}, "'allOf' with more",
     True),
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "integer"}], "type": "integer"}}}, "'allOf' with",
     True),
    ({"type": "object", "properties": {"a": {"allOf": []}}}, "non-empty array", False),
    ({"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
     "two alternatives can start with", True),
    ({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}, "required": ["next"]}},
      "$ref": "#/$defs/N"}, "no finite instance", False),
    ({"type": "object", "properties": {"a": {"$ref": "http://example.com/s.json"}}}, "must be '#' or name a definition", True),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}, "names no definition", False),
    ({"type": "object", "properties": {"a": {"type": "strng"}}}, "'strng' is not a JSON Schema type", False),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "names 'b'", True),
    ({"type": "object", "properties": {"a": {"enum": []}}}, "non-empty array", False),
    ({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}}, "minItems", False),
    ({"type": "object", "properties": {"a": 5}}, "must be a schema", False),
    ({"type": "object", "properties": {"a": {"enum": list(range(600))}}}, "more than 512 values", True),
])
def test_what_a_schema_may_not_use_is_refused_with_its_place(schema, words, unsupported) -> None:  # noqa: ANN001
    with pytest.raises(SchemaError) as err:
        compile_schema(json.dumps(schema))
    assert words in str(err.value) and err.value.unsupported is unsupported
    with pytest.raises(ValueError, match="json_schema"):
        SamplingParams(json_schema=json.dumps(schema))


def test_a_lone_surrogate_in_a_schema_is_refused() -> None:
    with pytest.raises(SchemaError, match="not Unicode"):
        compile_schema(json.dumps({"type": "object", "properties": {"\ud800": {}}}, ensure_ascii=False))


def brute_banned(vocab: JsonVocabulary, tokens: list[bytes], state: g.State, grammar) -> torch.Tensor:  # noqa: ANN001
    """The tokens ``grammar`` refuses in ``state``, each tried byte by byte (the masks' oracle)."""
    banned = torch.ones(vocab.width, dtype=torch.bool)
    for i, tok in enumerate(tokens):
        if tok and vocab.advance(state, i, grammar) is not None:
            banned[i] = False
    return banned


def run_choices(engine: LLMEngine) -> dict:
    """Step ``engine`` until done: each (request, choice) to [its text, its finish reason]."""
    out: dict = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            for d in o.deltas:
                entry = out.setdefault((o.request_id, d.index), ["", None])
                entry[0] += d.text
                entry[1] = d.finish_reason
    return out


def test_masks_ban_exactly_what_the_schema_refuses() -> None:
    rng = random.Random(2)
    tokens = [bytes([b]) for b in range(256)] + [
        b"", b'{"', b'":', b'": "', b'",', b'"}', b"}}", b"]]}", b'"cat"', b'"ca', b"ter", b"pillar", b"12", b"null",
        b"true", b"e+", b"\\u", b'\\"', b"\n  ", b'"name": "', b"},{", "日".encode()[:2], "日本".encode()]
    width = len(tokens) + 2
    vocab = JsonVocabulary(tokens, width, eos_token_ids=[256])
    checked = 0
    for _ in range(25):
        schema = _root_schema(rng)
        grammar = compile_schema(json.dumps(schema))
        data = _written(rng, _instance(rng, schema, schema), schema).encode()
        state = grammar.initial
        for b in data:
            if rng.random() < 0.2:
                assert torch.equal(vocab.banned(state, grammar), brute_banned(vocab, tokens, state, grammar)), (
                    schema, state)
                checked += 1
            state = grammar.step(state, b)
    assert checked > 100


def test_finished_choices_validate_on_the_tiny_model(engine_config, tiny_model_dir) -> None:
    """Random weights, nudged towards closing: whatever they write, each choice that stops is an
    instance of the schema, and one cut by max_tokens a prefix of one."""
    schema = {"type": "object", "properties": {
        "kind": {"enum": ["cat", "dog", "caterpillar"]}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "owner": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"n": {"type": "number"}},
                                                "required": ["n"]}]},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
        "pair": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": False}},
        "required": ["kind", "age", "tags", "counts", "pair"]}
    text = json.dumps(schema)
    engine = LLMEngine(engine_config(tiny_model_dir))
    for i in range(6):
        engine.add_request(f"r{i}", list(b"Answer: "), SamplingParams(
            n=2, seed=i, temperature=1.0, max_tokens=200, json_schema=text,
            logit_bias={ord('"'): 3.0, ord("]"): 3.0, ord("}"): 3.0, ord(","): 1.0}))
    out = run_choices(engine)
    grammar = compile_schema(text)
    assert len(out) == 12
    for answer, reason in out.values():
        if reason == "stop":
            assert valid(json.loads(answer), schema, schema), answer
        else:
            assert reason == "length" and _accepts(grammar, answer.encode()) is not None, answer
    assert "stop" in [r for _, r in out.values()]


def _complete(schema: dict, text: str) -> bool:
    state = _accepts(compile_schema(json.dumps(schema)), text.encode())
    return state is not None and g.is_complete(state)


def test_what_the_review_found_the_compiler_let_through() -> None:
    """Found by review: each of these completed on an answer that is not an instance."""
    assert not _complete({"type": "object", "properties": {"x": {"enum": [1.5]}}}, '{"x":NaN}')
    with pytest.raises(SchemaError, match="NaN"):  # (Python's parser reads NaN in a schema)
        compile_schema('{"type": "object", "properties": {"x": {"enum": [NaN]}}}')
    closed = {"type": "object", "properties": {}, "additionalProperties": False}  # OpenAI's strict "no fields"
    assert _complete(closed, "{}") and not _complete(closed, '{"junk":1}')
    ints = {"type": "object", "additionalProperties": {"type": "integer"}}  # a map of integers (now honoured)
    assert _complete(ints, '{"a":1,"a":2}') and not _complete(ints, '{"a":"1"}')
    typed_enum = {"type": "object", "properties": {"n": {"type": "integer", "enum": [1, "a"]}}, "required": ["n"]}
    assert _complete(typed_enum, '{"n":1}') and not _complete(typed_enum, '{"n":"a"}')
    for beside in ({"anyOf": [{"type": "string"}], "type": "object", "properties": {"a": {}}},
                   {"$ref": "#/$defs/A", "type": "string"}):
        with pytest.raises(SchemaError, match="beside other constraints"):
            compile_schema(json.dumps({"type": "object", "properties": {"p": beside}, "$defs": {"A": {}}}))
    with pytest.raises(SchemaError, match="'dependencies'"):
        compile_schema(json.dumps({"type": "object", "dependencies": {"a": ["b"]}}))


def _nested(levels: int) -> dict:
    schema: dict = {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}
    for _ in range(levels - 1):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_nesting_is_bounded_where_the_recognizer_can_follow() -> None:
    """Found by review: a schema needing 70 levels compiled, and at the 64th only EOS could follow
    (the answer cut, "stop"); 250 levels raised RecursionError (a 500 at the gateway)."""
    deepest = _nested(g.MAX_DEPTH)
    text = '{"a":' * (g.MAX_DEPTH - 1) + '{"v":1}' + "}" * (g.MAX_DEPTH - 1)
    assert _complete(deepest, text)
    for levels in (g.MAX_DEPTH + 1, 250, 2000):  # (written out by hand: json.dumps cannot nest 2,000 deep)
        text = '{"type":"object","required":["a"],"properties":{"a":' * levels + '{"type":"integer"}' + "}}" * levels
        with pytest.raises(SchemaError, match="nest") as err:
            compile_schema(text)
        assert err.value.unsupported
    deep_use: dict = {"type": "object", "properties": {"d": {"$ref": "#/$defs/D"}}}
    for _ in range(30):
        deep_use = {"type": "array", "items": deep_use}
    shared = {"$defs": {"D": _nested(40)}, "type": "object",  # a definition used deep counts there
              "properties": {"x": {"$ref": "#/$defs/D"}, "y": deep_use}}
    grammar = compile_schema(json.dumps(shared))  # (optional where it would nest too deep: never begun there)
    inside = '{"y":' + "[" * 30 + "{"
    state = _accepts(grammar, inside.encode())
    assert grammar.step(state, ord("}")) is not None and _accepts(grammar, (inside + '"d"').encode()) is None
    deeper = {**shared, "required": ["x", "y"], "properties": {**shared["properties"], "y": {
        "type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": _nested(63)}}}}
    with pytest.raises(SchemaError, match="more than 64 deep"):
        compile_schema(json.dumps(deeper))


def test_long_arrays_share_their_masks() -> None:
    """Found by review: each item of an array made its masks anew (the count of items begun was in
    the cache key), ~200x slower per token than JSON mode on a long list."""
    tokens = [bytes([b]) for b in range(256)] + [b'", "', b'"]', b', ', b'","']
    vocab = JsonVocabulary(tokens, len(tokens), eos_token_ids=[0])
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"},
                                                         "minItems": 2, "maxItems": 400}}, "required": ["items"]}
    grammar = compile_schema(json.dumps(schema))
    state = grammar.initial
    text = '{"items": [' + ", ".join(f'"w{i}"' for i in range(300)) + "]}"
    for b in text.encode():
        vocab.banned(state, grammar)
        state = grammar.step(state, b)
    assert g.is_complete(state) and vocab.walked < 40, vocab.walked
    near = '{"items": [' + ", ".join(f'"w{i}"' for i in range(399))  # the bound still counts, exactly
    state = _accepts(grammar, near.encode())
    for tok, data in enumerate(tokens):
        assert (vocab.advance(state, tok, grammar) is None) == bool(vocab.banned(state, grammar)[tok]), data


def test_valid_schemas_the_review_found_refused() -> None:
    both = {"type": "object", "properties": {"n": {"type": ["number", "integer", "number"]}}, "required": ["n"]}
    assert _complete(both, '{"n":1.5}') and _complete(both, '{"n":2}')
    empty = {"type": "object", "properties": {"a": {"type": "array", "items": False}}, "required": ["a"]}
    assert _complete(empty, '{"a":[]}') and not _complete(empty, '{"a":[1]}')


def test_properties_count_as_parts_and_keys_match_by_index() -> None:
    """Found by QA: 11,000 optional properties sharing one $ref were 2 parts, and matching a key
    byte looped over all of them: one mask took tens of seconds on the step, holding every request."""
    many = {"type": "object", "$defs": {"V": {"type": "integer"}},
            "properties": {f"k{i}": {"$ref": "#/$defs/V"} for i in range(3000)}}
    with pytest.raises(SchemaError, match="too large") as err:
        compile_schema(json.dumps(many))
    assert err.value.unsupported
    names = ["n", "n1", "n12", "n123", "m", "n2"]  # prefixes of one another, optional but "m"
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": ["m"]}
    for text, ok in (('{"n12":1,"m":2}', True), ('{"n":1,"n1":2,"n12":3,"n123":4,"m":5,"n2":6}', True),
                     ('{"n123":1,"n1":2,"m":3}', False), ('{"n2":1}', False), ('{"m":1,"n2":2}', True),
                     ('{"n12":1,"n12":2,"m":3}', False), ('{"n1234":1,"m":2}', False), ('{"m":1,"n":2}', False)):
        assert _complete(schema, text) is ok, text


@pytest.mark.parametrize("sub", [
    {"const": "x", "enum": ["y"]},
    {"enum": ["x", 1], "anyOf": [{"type": "string"}]},
    {"enum": [{"b": 1}], "properties": {"b": {"type": "string"}}},
    {"enum": [[1]], "items": {"type": "string"}},
    {"enum": [[1]], "minItems": 2},
    {"oneOf": [{}, {"type": "string"}]},
    {"oneOf": [True, {"type": "string"}]},
    {"properties": {"a": {}}, "items": {}},
    {"type": "array", "items": [{"type": "string"}], "prefixItems": [{"type": "integer"}]},
    {"type": "object", "properties": {"b": {}}, "minProperties": 1},
    {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 2},
])
def test_keywords_a_compiled_schema_would_drop_are_refused(sub) -> None:  # noqa: ANN001
    """Found by QA: each of these compiled, one keyword dropped, and served answers that do not validate."""
    with pytest.raises(SchemaError) as err:
        compile_schema(json.dumps({"type": "object", "properties": {"a": sub}, "required": ["a"]}))
    assert err.value.unsupported, err.value


def test_untyped_object_and_array_keywords_say_which_it_is() -> None:
    """Found by QA: ``maxItems``, ``additionalProperties`` or ``required`` without a ``type`` took any value."""
    def wrap(sub: dict) -> dict:
        return {"type": "object", "properties": {"a": sub}, "required": ["a"]}

    assert _complete(wrap({"maxItems": 0}), '{"a":[]}') and not _complete(wrap({"maxItems": 0}), '{"a":[1]}')
    assert not _complete(wrap({"maxItems": 0}), '{"a":"s"}')
    closed = wrap({"additionalProperties": False})
    assert _complete(closed, '{"a":{}}') and not _complete(closed, '{"a":{"x":1}}')
    with pytest.raises(SchemaError, match="names 'z'"):
        compile_schema(json.dumps(wrap({"required": ["z"]})))


def test_an_allof_of_one_schema_is_that_schema() -> None:
    """pydantic v1 and other generators write a described reference as ``allOf`` of one ``$ref``."""
    schema = {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
              "type": "object", "properties": {"p": {"allOf": [{"$ref": "#/$defs/P"}], "description": "a point"},
                                               "any": {"allOf": [True, {}]}}, "required": ["p", "any"]}
    assert _complete(schema, '{"p":{"x":1},"any":[null]}') and not _complete(schema, '{"p":{"x":"1"},"any":1}')


def test_a_whole_float_is_an_integer_and_pointer_escapes_resolve() -> None:
    ints = {"type": "object", "properties": {"a": {"type": "integer", "enum": [1.0, 2.5]}}, "required": ["a"]}
    assert _complete(ints, '{"a":1.0}') and not _complete(ints, '{"a":2.5}')
    refs = {"type": "object", "$defs": {"a/b": {"type": "integer"}, "c d": {"type": "string"}},
            "properties": {"x": {"$ref": "#/$defs/a~1b"}, "y": {"$ref": "#/$defs/c%20d"}}, "required": ["x", "y"]}
    assert _complete(refs, '{"x":1,"y":"s"}') and not _complete(refs, '{"x":"s","y":"s"}')


def test_a_held_grammar_is_found_again_after_the_lru_let_it_go() -> None:
    """A request's grammar is compiled once: its SamplingParams hold it, and ``compile_schema``
    finds a held grammar however many other schemas came between (found by review: 17 distinct
    schemas in a burst had the gateway's event loop compile again); one nobody holds is let go."""
    import gc

    from engine.ipc_wire import params_fields

    text = json.dumps({"type": "object", "properties": {"held": {"type": "string", "pattern": "^[a-z]{3}$"}}})
    params = SamplingParams(json_schema=text)
    grammar = params.grammar
    assert grammar is compile_schema(text)
    for i in range(40):  # past the LRU's 16 entries
        compile_schema(json.dumps({"type": "object", "properties": {f"other{i}": {"type": "integer"}}}))
    assert compile_schema(text) is grammar
    assert SamplingParams(json_schema=text).grammar is grammar
    assert params == SamplingParams(json_schema=text)  # not a parameter: not compared ...
    assert len(params_fields(params)) == len([f for f in dataclasses.fields(SamplingParams) if f.init])  # nor sent
    assert grammar not in params_fields(params)
    lone = json.dumps({"type": "object", "properties": {"lone": {"type": "boolean"}}})
    ref = weakref.ref(compile_schema(lone))
    for i in range(40):
        compile_schema(json.dumps({"type": "object", "properties": {f"again{i}": {"type": "integer"}}}))
    gc.collect()
    assert ref() is None  # held by nothing: let go (the LRU bounds what is kept)
