#!/usr/bin/env python3
"""Writes tests/fixtures/tool_turns/: the golden data for multi-turn GRPO episodes with tool calls
(finetune --objective grpo --environment-command; src/data/tool_calls.*, src/train/environment.*).

Output (rewritten on every run; nothing else is touched):
  tokenizer.json, tokenizer_config.json  the bundled data/tokenizer plus Gemma 4's tool-call control tokens
                 (<|tool>, <tool|>, <|tool_call>, <tool_call|>, <|tool_response>, <tool_response|>, <|"|>) as
                 added special tokens, saved by transformers
  golden.json    {"template": ..., "sha256": ..., "trl": ..., "transformers": ..., "cases": [...]}; per case:
    messages         the prompt (user turns)
    calls            the assistant's tool_calls (OpenAI layout: {"type": "function", "function": {"name", "arguments"}})
    results          the tool messages answering them ({"role": "tool", "name"?, "content": text or JSON value})
    answer           the assistant's text after the results
    prompt_ids       apply_chat_template(messages, add_generation_prompt=True)
    call_ids         what a model trained on the template draws for the calls: the rendering of
                     messages + [assistant with tool_calls] (add_generation_prompt=False) after prompt_ids; it ends with
                     the template's <|tool_response> (where generation stops)
    parsed           TRL's parse_response(tokenizer, call_ids, prefix=prompt_ids) with TRL's Gemma 4 response template
                     (what GRPOTrainer hands its tools loop): {"role", "content", "tool_calls"}
    result_ids       the tokens fed after the call: the rendering of messages + [assistant] + results
                     (add_generation_prompt=True) after prompt_ids + call_ids (TRL's _get_tool_suffix_ids, on the real
                     conversation)
    answer_ids       the rendering of the whole conversation (results followed by the assistant's answer) after
                     prompt_ids + call_ids + result_ids: the answer's text and <turn|>\n
    user_ids         the rendering of messages + [assistant] + [a user turn "Never mind, thanks."]
                     (add_generation_prompt=True) after prompt_ids + call_ids: a user turn answering a tool call
  and "declarations": per case {"tools", "messages", "ids"}: apply_chat_template(messages, tools=tools,
                     add_generation_prompt=True), the tool schemas written into the system turn; schemas of many shapes
                     (enums, arrays of scalars and of objects, nested objects with and without properties, nullable,
                     mixed-case keys, no parameters, a response declaration) and one from transformers' get_json_schema
                     of a typed, documented Python function (what TRL's GRPOTrainer(tools=[...]) renders)

The chat template is TRL's copy of Google's Gemma 4 template (trl/chat_templates/gemma4_v5.jinja, as
tools/make_chat_fixtures.py uses). Each prefix property (prompt_ids + call_ids is a prefix of the rendering with the
results, and so on) is asserted, so the pieces concatenate to transformers' tokens of the whole conversation.

Usage (from any directory):  tools/.venv/bin/python tools/make_tool_turn_fixtures.py
Needs tools/.venv (tools/requirements.txt). Offline, a few seconds; a rerun writes byte-identical files.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hashlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import transformers  # noqa: E402
import trl  # noqa: E402
from tokenizers import AddedToken  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl.chat_template_utils import add_response_schema, parse_response  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "tool_turns")
TEMPLATE = os.path.join(os.path.dirname(trl.__file__), "chat_templates", "gemma4_v5.jinja")
CONTROL = ["<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>']


def call(name, arguments, id=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if id:
        c["id"] = id
    return c


CASES = [
    # One call, a string result.
    ([{"role": "user", "content": "What is the weather in Paris?"}],
     [call("get_weather", {"location": "Paris"})],
     [{"role": "tool", "name": "get_weather", "content": "22 C, sunny"}],
     "It is 22 C and sunny in Paris."),
    # Two calls in one turn, numbers (integers, a float, a negative one), two results. With several calls the
    # template names each result by matching tool_call_id to a call's id (without ids every result would take the
    # last call's name): slicetrain names them as the environment does or by position, which is this.
    ([{"role": "user", "content": "Compute 2 + 3 and 1.5 * -4."}],
     [call("add", {"a": 2, "b": 3}, "c0"), call("mul", {"x": 1.5, "y": -4}, "c1")],
     [{"role": "tool", "tool_call_id": "c0", "name": "add", "content": "5"},
      {"role": "tool", "tool_call_id": "c1", "name": "mul", "content": "-6.0"}],
     "2 + 3 = 5 and 1.5 * -4 = -6."),
    # Nested arguments (an object, a list, true, null, an empty string) and a result that is JSON text (the
    # template renders a tool message's content as text, a number or a list of text parts, not an object: slicetrain
    # writes an object an environment answers with as its compact JSON text, which is this string).
    ([{"role": "system", "content": "You can search."}, {"role": "user", "content": "Find German pages on Gemma 4."}],
     [call("search", {"query": "gemma 4", "filters": {"lang": "de", "safe": True, "max_age": 30},
                      "limit": None, "tags": ["ml", "llm"], "note": ""})],
     [{"role": "tool", "name": "search",
       "content": json.dumps({"hits": 2, "top": "Gemma 4 – Überblick", "ok": True, "scores": [0.5, 0.25], "next": None},
                             separators=(",", ":"), sort_keys=True, ensure_ascii=False)}],
     "I found 2 pages; the best is 'Gemma 4 – Überblick'."),
    # A call without arguments; a result with a quote, a brace and a newline; a tool message without a name
    # (the template then writes 'unknown' unless a tool_call_id matches; slicetrain uses the call's name, so the
    # golden gives the name explicitly here and the test checks the nameless form separately).
    ([{"role": "user", "content": "What time is it?"}],
     [call("now", {})],
     [{"role": "tool", "name": "now", "content": 'time: "12:00" {UTC}\nday: Tuesday'}],
     "It is noon UTC."),
    # A result that is a number, not text.
    ([{"role": "user", "content": "How many moons has Mars?"}],
     [call("lookup", {"body": "Mars", "field": "moons"})],
     [{"role": "tool", "name": "lookup", "content": 2}],
     "Mars has 2 moons."),
]


def get_weather(location: str, unit: str = "celsius", days: int = 1) -> str:
    """
    Gets the weather forecast for a place.

    Args:
        location: The city, e.g. Paris.
        unit: The temperature unit.
        days: How many days ahead.
    """
    return ""


def fn(name, description, parameters=None, **extra):
    f = {"name": name, "description": description}
    if parameters is not None:
        f["parameters"] = parameters
    f.update(extra)
    return {"type": "function", "function": f}


TOOLSETS = [
    [fn("get_time", "Tells the time.")],
    [fn("search", "Searches the web.", {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for"},
            "lang": {"type": "string", "enum": ["de", "en", "fr"]},
            "limit": {"type": "integer", "description": "At most this many", "nullable": True},
            "safe": {"type": "boolean"},
            "Score": {"type": "number", "description": "Minimum score"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "filters": {"type": "object", "description": "Extra filters",
                        "properties": {"site": {"type": "string"}, "after": {"type": "string", "description": "A date"}},
                        "required": ["site"]},
            "meta": {"type": "object", "owner": {"type": "string"}, "level": {"type": "integer"}},
            "points": {"type": "array", "description": "Places",
                       "items": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                 "required": ["x", "y"]}},
            "mixed": {"type": "array", "items": {"type": ["string", "null"], "maxLength": 8}},
        },
        "required": ["query", "lang"],
    })],
    [fn("add", "Adds two numbers.", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                                     "required": ["a", "b"]}),
     fn("lookup", "Looks a fact up.", {"type": "object", "properties": {"body": {"type": "string"}}},
        response={"description": "The fact", "type": "object"})],
]


def ids_of(tok, messages, add_generation_prompt, tools=None):
    with open(TEMPLATE, encoding="utf-8") as f:
        template = f.read()
    return tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=False,
                                   add_generation_prompt=add_generation_prompt, tools=tools)


def after(full, prefix, what):
    assert full[: len(prefix)] == prefix, f"{what}: not a prefix"
    return full[len(prefix):]


def main():
    tmp = tempfile.mkdtemp()
    try:
        tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "data", "tokenizer"))
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL], special_tokens=True)
        tok.save_pretrained(tmp)
        tok = AutoTokenizer.from_pretrained(tmp)
        with open(TEMPLATE, encoding="utf-8") as f:
            tok.chat_template = f.read()
        tok = add_response_schema(tok)
        cases = []
        for messages, calls, results, answer in CASES:
            assistant = {"role": "assistant", "content": "", "tool_calls": calls}
            prompt_ids = ids_of(tok, messages, True)
            call_ids = after(ids_of(tok, messages + [assistant], False), prompt_ids, "call")
            assert tok.convert_ids_to_tokens(call_ids[-1]) == "<|tool_response>"
            parsed = parse_response(tok, call_ids, prefix=prompt_ids)
            result_ids = after(ids_of(tok, messages + [assistant] + results, True), prompt_ids + call_ids, "results")
            final = {"role": "assistant", "content": answer}
            answer_ids = after(ids_of(tok, messages + [assistant] + results + [final], False),
                               prompt_ids + call_ids + result_ids, "answer")
            user = {"role": "user", "content": "Never mind, thanks."}
            user_ids = after(ids_of(tok, messages + [assistant, user], True), prompt_ids + call_ids, "user")
            cases.append({"messages": messages, "calls": calls, "results": results, "answer": answer,
                          "prompt_ids": prompt_ids, "call_ids": call_ids, "parsed": parsed,
                          "result_ids": result_ids, "answer_ids": answer_ids, "user_ids": user_ids})
        from transformers.utils import get_json_schema
        declarations = []
        for tools in TOOLSETS + [[get_json_schema(get_weather)]]:
            for messages in ([{"role": "user", "content": "Hello."}],
                             [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"}]):
                declarations.append({"tools": tools, "messages": messages,
                                     "ids": ids_of(tok, messages, True, tools=tools)})
        os.makedirs(OUT, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(tmp, name), os.path.join(OUT, name))
        with open(TEMPLATE, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        golden = {"template": "trl/chat_templates/gemma4_v5.jinja", "sha256": sha, "trl": trl.__version__,
                  "transformers": transformers.__version__, "cases": cases, "declarations": declarations}
        with open(os.path.join(OUT, "golden.json"), "w", encoding="utf-8") as f:
            json.dump(golden, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {OUT}: {len(cases)} cases")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
