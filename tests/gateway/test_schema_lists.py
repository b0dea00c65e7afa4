"""The request schemas' lists stop at their first bad item (pydantic's ``fail_fast``): found by a
fuzzing QA, 1.5 million wrong items made as many errors, 2 s of one event loop each time."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gateway.error_handlers import ErrorJSONResponse
from gateway.errors import ApiError, quoted_name
from gateway.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

MANY = 100_000


@pytest.mark.parametrize(("model", "body", "where"), [
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": ["a"] * MANY}]}, "messages"),
    (ChatCompletionRequest, {"messages": ["a"] * MANY}, "messages"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "a"}], "stop_token_ids": [0.5] * 300},
     "stop_token_ids"),
    (CompletionRequest, {"prompt": [1.5] * MANY}, "prompt"),
    (CompletionRequest, {"prompt": [[1.5] * MANY]}, "prompt"),
    (CompletionRequest, {"prompt": ["a", *([1] * MANY)]}, "prompt"),
    (EmbeddingRequest, {"input": [[1.5] * MANY]}, "input"),
    (EmbeddingRequest, {"input": ["a", *([None] * 2000)]}, "input"),
])
def test_a_list_of_many_wrong_items_makes_few_errors(model, body, where) -> None:  # noqa: ANN001
    raw = json.dumps({"model": "m", **body}).encode()
    for validate in (lambda: model.model_validate_json(raw), lambda: model.model_validate(json.loads(raw))):
        with pytest.raises(ValidationError) as info:
            validate()
        assert info.value.error_count() <= 3, info.value.error_count()
        assert all(e["loc"][0] == where for e in info.value.errors())


def test_an_error_quoting_a_lone_surrogate_is_still_json() -> None:
    """The safety net under ``quoted_name``: an error message holding a lone surrogate is answered
    with JSON's escape for it (it was a 500)."""
    resp = ErrorJSONResponse(ApiError(400, "bad '\ud800'").body(), status_code=400)
    assert json.loads(resp.body)["error"]["message"] == "bad '\ud800'"
    assert quoted_name("x\ud800") == "x\\ud800" and quoted_name("é" * 300).endswith("(300 characters)")


def test_a_body_with_few_braces_is_not_parsed_for_its_objects(monkeypatch) -> None:
    """Found by a re-check: every chat body over 32 KiB was parsed once more to count its objects,
    0.34 s for 1.25 million numbers. A body with no more ``{`` than the limit cannot hold more
    objects, and is not parsed; braces inside text count for the scan, not for the answer."""
    from gateway import deps

    parsed = []
    real = json.loads
    monkeypatch.setattr(deps.json, "loads", lambda *a, **kw: parsed.append(1) or real(*a, **kw))
    numbers = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                          "zz": [[1.5] * 5] * 20_000}).encode()
    assert not deps.holds_too_many_objects(numbers, ChatCompletionRequest.max_json_objects) and parsed == []
    braces = json.dumps({"model": "m", "messages": [{"role": "user", "content": "{}" * 20_000}]}).encode()
    assert not deps.holds_too_many_objects(braces, ChatCompletionRequest.max_json_objects) and parsed == [1]
    objects = json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]
                                                      * 20_000}]}).encode()
    assert deps.holds_too_many_objects(objects, ChatCompletionRequest.max_json_objects)
