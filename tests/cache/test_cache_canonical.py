"""Canonical request: what changes the keys and what does not."""

from cache_testlib import chat

from cache.canonical import GREEDY_BELOW, canonicalize, is_deterministic


def keys(body, ns="tenant-a"):
    c = canonicalize(ns, body)
    return c.exact_key, c.context_key


def test_identical_requests_share_keys():
    assert keys(chat("Hi there")) == keys(chat("Hi there"))


def test_tenant_changes_both_keys():
    a, b = keys(chat("Hi"), "tenant-a"), keys(chat("Hi"), "tenant-b")
    assert a[0] != b[0] and a[1] != b[1]


def test_every_answer_changing_parameter_changes_both_keys():
    base = keys(chat("Hi"))
    for change in [dict(temperature=0.5), dict(top_p=0.9), dict(max_tokens=7), dict(stop=["\n"]),
                   dict(n=2), dict(top_k=5), dict(response_format={"type": "json_object"}),
                   dict(presence_penalty=0.5), dict(frequency_penalty=-1.0), dict(repetition_penalty=1.2), dict(min_tokens=3),
                   dict(model="other-model")]:
        body = chat("Hi") | change
        ek, ck = keys(body)
        assert ek != base[0] and ck != base[1], change
    sampled = keys(chat("Hi", temperature=0.5))  # a seed changes a sampled answer (not a greedy one: below)
    assert keys(chat("Hi", temperature=0.5, seed=3))[0] != sampled[0]


def test_transport_fields_and_defaults_do_not_change_keys():
    base = keys(chat("Hi"))
    assert keys(chat("Hi", stream=True, stream_options={"include_usage": True}, user="u1")) == base
    assert keys(chat("Hi", n=1, top_p=1.0, stop=None, logprobs=False)) == base
    assert keys(chat("Hi", max_tokens=9)) == keys(chat("Hi", max_completion_tokens=9))
    assert keys(chat("Hi", stop="x")) == keys(chat("Hi", stop=["x"]))
    parts = chat("Hi")
    parts["messages"][0]["content"] = [{"type": "text", "text": "H"}, {"type": "text", "text": "i"}]
    assert keys(parts) == base


def test_every_explicit_default_counts_as_absent():
    """Found by QA: ``stop_token_ids: []`` and ``tool_choice: "none"`` split the key of a repeat."""
    base = keys(chat("Hi"))
    for default in [dict(stop_token_ids=[]), dict(tool_choice="none"), dict(tools=[]), dict(functions=[]),
                    dict(function_call="none"), dict(logit_bias={}), dict(modalities=["text"]),
                    dict(top_k=-1), dict(top_k=0), dict(stop=[]), dict(response_format={"type": "text"}),
                    dict(min_tokens=0), dict(ignore_eos=False), dict(repetition_penalty=1)]:
        assert keys(chat("Hi") | default) == base, default
    # tools whose choice is "none" never reach the model: one key with and without them
    tool = {"type": "function", "function": {"name": "f"}}
    assert keys(chat("Hi", tools=[tool], tool_choice="none")) == base
    assert keys(chat("Hi", functions=[{"name": "f"}], function_call="none")) == base
    seeded = keys(chat("Hi", temperature=None, seed=7))
    assert keys(chat("Hi", temperature=1, seed=7)) == seeded  # the engine's temperature
    # one seed to the engine (its 64 bits), one key (found by QA: -1 and 2**64 - 1 were two entries)
    assert keys(chat("Hi", seed=-1, temperature=1)) == keys(chat("Hi", seed=2**64 - 1, temperature=1))
    assert keys(chat("Hi", seed=-2, temperature=1)) != keys(chat("Hi", seed=-1, temperature=1))
    # greedy: the seed changes nothing (a re-check QA: four entries of one answer)
    assert keys(chat("Hi", seed=1)) == keys(chat("Hi", seed=2)) == keys(chat("Hi")) == keys(chat("Hi", seed=-1,
                                                                                           temperature=1e-7))
    # a value that is not the default still counts, whatever its truthiness
    assert keys(chat("Hi", stop_token_ids=[0])) != base
    assert keys(chat("Hi", top_k=1)) != base


def test_final_message_changes_exact_key_only():
    a, b = keys(chat("How do I reset my password?")), keys(chat("How can I reset my password?"))
    assert a[0] != b[0] and a[1] == b[1]


def test_earlier_turns_change_the_context():
    h1 = [{"role": "user", "content": "Tell me about Paris"}, {"role": "assistant", "content": "Paris is..."}]
    h2 = [{"role": "user", "content": "Tell me about Rome"}, {"role": "assistant", "content": "Rome is..."}]
    a, b = keys(chat("What is its population?", history=h1)), keys(chat("What is its population?", history=h2))
    assert a[0] != b[0] and a[1] != b[1]
    sys1 = [{"role": "system", "content": "Answer in French."}]
    assert keys(chat("Hi", history=sys1)) != keys(chat("Hi"))


def test_query_only_for_a_final_user_message():
    assert canonicalize("t", chat("Hi")).query == "Hi"
    body = chat("Hi")
    body["messages"].append({"role": "assistant", "content": "prefill"})
    assert canonicalize("t", body).query is None


def test_determinism():
    assert is_deterministic(chat("x"))
    assert is_deterministic({"seed": 1, "temperature": 0.8})
    assert not is_deterministic({"temperature": 0.7})
    assert not is_deterministic({})


def test_developer_role_is_the_system_role():
    """The engine gets a developer message as a system one: same prompt, same answer, same keys."""
    dev = chat("Hi", history=[{"role": "developer", "content": "Answer in French."}])
    sys_ = chat("Hi", history=[{"role": "system", "content": "Answer in French."}])
    assert keys(dev) == keys(sys_)


def test_temperatures_below_the_greedy_threshold_are_greedy():
    from engine.sampling_params import GREEDY_BELOW as ENGINE_GREEDY_BELOW

    assert GREEDY_BELOW == ENGINE_GREEDY_BELOW  # cache/ may not import the engine: keep them equal
    assert is_deterministic(chat("x", temperature=1e-6))
    assert not is_deterministic(chat("x", temperature=GREEDY_BELOW))
    assert keys(chat("Hi", temperature=1e-6)) == keys(chat("Hi", temperature=0))
    assert keys(chat("Hi", temperature=1e-4)) != keys(chat("Hi", temperature=0))


def test_a_schemas_property_order_and_the_grammars_version_are_in_the_key(monkeypatch) -> None:
    """Found by QA: the key's sorted JSON made two schemas that differ only in their properties'
    order one key, and the second was served the first's answer, in the first's order; an answer
    of an earlier grammar was served after a fix changed what the grammar allows."""
    from cache import canonical

    def fmt(*names: str) -> dict:
        schema = {"type": "object", "properties": {n: {"type": "string"} for n in names}}
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}

    a, b = (canonicalize("t", chat("Where?") | fmt(*names)) for names in (("city", "country"), ("country", "city")))
    assert a.exact_key != b.exact_key and a.context_key != b.context_key
    assert canonicalize("t", chat("Where?") | fmt("city", "country")).exact_key == a.exact_key
    monkeypatch.setattr(canonical, "FORMAT_GRAMMAR_VERSION", canonical.FORMAT_GRAMMAR_VERSION + 1)
    assert canonicalize("t", chat("Where?") | fmt("city", "country")).exact_key != a.exact_key


def test_tool_call_ids_are_keyed_by_the_call_they_name() -> None:
    """The model is never shown a call's id (a result is shown with its call's name): the same
    conversation with other ids is one key; results swapped between two calls are another."""
    def conversation(ids: tuple[str, str], answers: tuple[str, str]) -> dict:
        calls = [{"id": ids[0], "type": "function", "function": {"name": "weather", "arguments": "{}"}},
                 {"id": ids[1], "type": "function", "function": {"name": "time", "arguments": "{}"}}]
        return chat("Weather and time?", temperature=0, messages=[
            {"role": "user", "content": "Weather and time?"}, {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": answers[0], "content": "sun"},
            {"role": "tool", "tool_call_id": answers[1], "content": "noon"}])
    base = canonicalize("t", conversation(("a", "b"), ("a", "b")))
    same = canonicalize("t", conversation(("call_x", "call_y"), ("call_x", "call_y")))
    swapped = canonicalize("t", conversation(("a", "b"), ("b", "a")))
    assert same.exact_key == base.exact_key and same.context_key == base.context_key
    assert swapped.exact_key != base.exact_key


def test_results_of_one_function_called_twice_are_keyed_by_their_arguments() -> None:
    """Found by the re-check: two calls of one function are shown with their arguments, so their
    results swapped are another prompt, and were one key (a hit served the other answer)."""
    def conversation(answers: tuple[str, str]) -> dict:
        calls = [{"id": c, "type": "function", "function": {"name": "weather", "arguments": f'{{"city": "{city}"}}'}}
                 for c, city in (("a", "Paris"), ("b", "London"))]
        return chat("Weather?", temperature=0, messages=[
            {"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": answers[0], "content": "sun"},
            {"role": "tool", "tool_call_id": answers[1], "content": "rain"}])
    assert canonicalize("t", conversation(("a", "b"))).exact_key != canonicalize("t", conversation(("b", "a"))).exact_key


def test_parallel_tool_calls_counts_only_for_tools_that_may_be_called() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    calls = chat("Hi", tools=[tool], tool_choice="required")
    assert keys(dict(calls, parallel_tool_calls=False)) != keys(calls) == keys(dict(calls, parallel_tool_calls=True))
    assert keys(chat("Hi", parallel_tool_calls=False)) == keys(chat("Hi"))
    off = chat("Hi", tools=[tool], tool_choice="none")
    assert keys(dict(off, parallel_tool_calls=False)) == keys(off) == keys(chat("Hi"))
    assert canonicalize("t", calls).query is None and canonicalize("t", off).query == "Hi"  # (exact tier only)
    assert keys(chat("Hi", tools=[tool], tool_choice="auto")) == keys(chat("Hi", tools=[tool])) != keys(calls)
