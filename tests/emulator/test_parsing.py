"""Request validation: vLLM 0.33's statuses and messages (VLLM.md §4), the
output-length rule, and the older wire variants."""

from __future__ import annotations

import pytest

from replayer.emulator.config import EmulatorConfig
from replayer.emulator.parsing import (
    ApiError,
    Generation,
    check_limits,
    parse_generation,
    parse_json_body,
)

pytestmark = pytest.mark.inprocess

CFG = EmulatorConfig(max_model_len=100)


def error_of(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as err:
        fn(*args)
    return err.value


def test_wrong_content_type_is_bad_request_with_null_param():
    e = error_of(parse_json_body, b'{"messages": []}', "text/plain")
    assert e.status == 400
    assert e.body("0.33") == (
        b'{"error":{"message":"1 validation error:\\n  Unsupported Media Type: Only '
        b'\'application/json\' is allowed","type":"Bad Request","param":null,"code":400}}'
    )


def test_malformed_json_reports_the_byte_offset():
    raw = b'{"model": "x", "messages": }'
    e = error_of(parse_json_body, raw, "application/json")
    assert e.param == "body.27" and e.type == "Bad Request"
    assert e.message == (
        "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.27', 'msg': 'JSON decode "
        "error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}"
    )


def test_empty_body_and_non_object_body():
    e = error_of(parse_json_body, b"", "application/json")
    assert e.message == (
        "1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field required', "
        "'input': 'None'}"
    )
    assert e.param == "body"
    assert error_of(parse_json_body, b"[1]", "application/json").param == "body"


def test_missing_messages_and_wrong_types():
    e = error_of(parse_generation, {"model": "m"}, True, CFG)
    assert e.message == (
        "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field "
        "required', 'input': '<dict of 1 items>'}"
    )
    assert e.param == "body.messages"
    e = error_of(parse_generation, {"messages": [], "max_tokens": "lots", "stream": []}, True, CFG)
    assert e.message == (
        "2 validation errors:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', 'msg': "
        "'Input should be a valid integer, unable to parse string as an integer', 'input': "
        "'lots'}\n  {'type': 'bool_type', 'loc': 'body.stream', 'msg': 'Input should be a valid "
        "boolean', 'input': '<list of 0 items>'}"
    )
    assert e.param == "body.max_tokens"


def test_max_completion_tokens_wins_for_chat():
    body = {"messages": [], "max_tokens": 5, "max_completion_tokens": 9}
    assert parse_generation(body, True, CFG).requested_max_tokens == 9
    assert parse_generation({"prompt": "x", "max_tokens": 5}, False, CFG).requested_max_tokens == 5


def test_lax_coercions_are_accepted():
    g = parse_generation(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "7", "stream": "true"},
        True,
        CFG,
    )
    assert g.requested_max_tokens == 7 and g.stream is True


def test_stream_options_require_stream():
    body = {"messages": [], "stream_options": {"include_usage": True}}
    e = error_of(parse_generation, body, True, CFG)
    assert (e.status, e.type, e.param) == (400, "BadRequestError", "stream_options")
    assert e.message == (
        "Stream options can only be defined when `stream=True`. (parameter=stream_options)"
    )


def test_usage_flags():
    base = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    g = parse_generation(
        base | {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        True,
        CFG,
    )
    assert (g.include_usage, g.continuous_usage) == (True, True)
    g = parse_generation(base | {"stream_options": {"continuous_usage_stats": True}}, True, CFG)
    assert (g.include_usage, g.continuous_usage) == (False, False)  # only with include_usage
    forced = EmulatorConfig(enable_force_include_usage=True)
    g = parse_generation(base, True, forced)
    assert (g.include_usage, g.continuous_usage) == (True, True)


def test_completion_prompt_forms():
    def plen(prompt):
        return parse_generation({"prompt": prompt}, False, CFG).prompt_len

    assert plen("abcdefgh") == 2
    assert plen([5, 6, 7]) == 3 and plen([[5, 6, 7]]) == 3 and plen(["abcd"]) == 1
    e = error_of(parse_generation, {"prompt": ""}, False, CFG)
    assert "Either prompt or prompt_embeds must be provided and non-empty." in e.message
    assert error_of(parse_generation, {"prompt": ["a", "b"]}, False, CFG).param == "prompt"
    e = error_of(parse_generation, {"prompt": [7, -1]}, False, CFG)  # pydantic's union errors
    assert (e.status, e.type, e.param) == (400, "Bad Request", "body.prompt.1")
    assert e.message == (
        "6 validation errors:\n"
        "  {'type': 'greater_than_equal', 'loc': 'body.prompt.1', 'msg': 'Input should be greater "
        "than or equal to 0', 'input': '-1', 'ctx': {'ge': 0}}\n"
        "  {'type': 'list_type', 'loc': 'body.prompt.0', 'msg': 'Input should be a valid list', "
        "'input': '7'}\n"
        "  {'type': 'list_type', 'loc': 'body.prompt.1', 'msg': 'Input should be a valid list', "
        "'input': '-1'}\n"
        "  {'type': 'string_type', 'loc': 'body.prompt', 'msg': 'Input should be a valid string', "
        "'input': '<list of 2 items>'}\n"
        "  {'type': 'string_type', 'loc': 'body.prompt.0', 'msg': 'Input should be a valid "
        "string', 'input': '7'}\n"
        "  {'type': 'string_type', 'loc': 'body.prompt.1', 'msg': 'Input should be a valid "
        "string', 'input': '-1'}"
    )


def gen(prompt_len: int, max_tokens: int | None = None, ids: bool = True, ignore_eos=False):
    from replayer.emulator.tokenizer import ids_stream

    return Generation(
        True, "m", False, False, False, max_tokens, ignore_eos, ids_stream([1] * prompt_len), ids
    )


def test_context_length_exceeded_text_and_token_ids():
    e = error_of(check_limits, gen(150, ids=False), CFG)
    assert (e.status, e.type, e.param) == (400, "BadRequestError", "input_tokens")
    assert e.message == (
        "This model's maximum context length is 100 tokens. However, your prompt contains at "
        "least 101 input tokens, which exceeds this limit even without any output tokens. Please "
        "reduce the length of the input prompt. (parameter=input_tokens, value=101)"
    )
    e = error_of(check_limits, gen(150, ids=True), CFG)
    assert "your prompt contains 150 input tokens" in e.message
    assert e.message.endswith("(parameter=input_tokens, value=150)")


def test_prompt_filling_the_context_and_max_tokens_over_the_limit():
    e = error_of(check_limits, gen(100), CFG)
    assert e.param is None and e.message.startswith(
        "The decoder prompt (length 100) plus the number of requested output tokens (at least 1) "
        "is longer than the maximum model length of 100."
    )
    e = error_of(check_limits, gen(10, 101), CFG)
    assert e.message == (
        "max_tokens=101 cannot be greater than max_model_len=100. Please request fewer output "
        "tokens. (parameter=max_tokens, value=101)"
    )
    assert e.param == "max_tokens"


def test_output_length_rules():
    assert check_limits(gen(10, 50), CFG) == (50, "length")
    assert check_limits(gen(60, 50), CFG) == (40, "length")  # 0.33 clamps silently
    assert check_limits(gen(10), CFG) == (16, "stop")  # --default-max-tokens
    assert check_limits(gen(10, ignore_eos=True), CFG) == (90, "length")
    eos = EmulatorConfig(max_model_len=100, eos_after=20)
    assert check_limits(gen(10, 50), eos) == (20, "stop")
    assert check_limits(gen(10, 20), eos) == (20, "length")  # vLLM's length check wins a tie
    assert check_limits(gen(10, 50, ignore_eos=True), eos) == (50, "length")


def test_older_versions_reject_overflow_with_their_wording():
    old = EmulatorConfig(max_model_len=100, vllm_version="0.20.2")
    e = error_of(check_limits, gen(60, 50), old)
    assert e.message == (
        "'max_tokens' or 'max_completion_tokens' is too large: 50. This model's maximum context "
        "length is 100 tokens and your request has 60 input tokens (50 > 100 - 60). "
        "(parameter=max_tokens, value=50)"
    )
    e = error_of(check_limits, gen(150, ids=False), old)
    assert e.message == (
        "This model's maximum context length is 100 tokens. However, your request has 150 input "
        "tokens. Please reduce the length of the input messages."
    )
    v09 = EmulatorConfig(max_model_len=100, vllm_version="0.9.2")
    e = error_of(check_limits, gen(60, 50), v09)
    assert e.body("0.9").startswith(b'{"object":"error","message":"This model\'s maximum context')
    assert "you requested 110 tokens (60 in the messages, 50 in the completion)" in e.message
