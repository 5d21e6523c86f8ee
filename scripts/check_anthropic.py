"""Checks Messages API request bodies against the anthropic SDK's own request types.

Usage: check_anthropic.py FILE, where FILE holds a JSON array of request bodies as Pulse
sent them. Each body, and each block, tool, system part and cache_control in it, must
be of the SDK's TypedDicts: no key they do not have, every key they require, every value
of their types (the cache_control lifetimes among them). Prints how many bodies and
breakpoints it checked; exits 1 with the first mismatch's place.

The SDK's types are TypedDicts whose lists are typing.Iterable, which pydantic
validates lazily (and, nested, not at all), so the walk below goes down the lists
itself and validates each part with its own type.
"""

import json
import sys
import typing

from anthropic import types as t
from anthropic.types import message_create_params as mcp
from pydantic import TypeAdapter

BLOCKS = {
    "text": t.TextBlockParam,
    "image": t.ImageBlockParam,
    "tool_use": t.ToolUseBlockParam,
    "tool_result": t.ToolResultBlockParam,
}
TOOL_RESULT_PARTS = {"text": t.TextBlockParam, "image": t.ImageBlockParam}


class Mismatch(Exception):
    pass


def keys(td, value, where):
    if not isinstance(value, dict):
        raise Mismatch(f"{where}: {td.__name__} is an object, not {value!r:.80}")
    known = td.__annotations__
    extra = set(value) - set(known)
    if extra:
        raise Mismatch(f"{where}: {td.__name__} has no {sorted(extra)}")
    # The SDK marks required keys Required[...] in annotations it leaves unevaluated.
    required = {k for k, v in known.items() if "Required[" in str(v) and "NotRequired[" not in str(v)}
    missing = required - set(value)
    if missing:
        raise Mismatch(f"{where}: {td.__name__} requires {sorted(missing)}")


def valid(tp, value, where):
    try:
        TypeAdapter(tp).validate_python(value)
    except Exception as e:  # pydantic's ValidationError, said in one line
        raise Mismatch(f"{where}: {' '.join(str(e).split())}") from None


def cache_control(part, where, seen):
    if "cache_control" in part and part["cache_control"] is not None:
        keys(t.CacheControlEphemeralParam, part["cache_control"], f"{where}.cache_control")
        valid(t.CacheControlEphemeralParam, part["cache_control"], f"{where}.cache_control")
        seen.append(part["cache_control"].get("ttl", "5m"))


def block(b, where, seen, kinds=BLOCKS):
    kind = b.get("type") if isinstance(b, dict) else None
    if kind not in kinds:
        raise Mismatch(f"{where}: a block of type {kind!r}, not one of {sorted(kinds)}")
    td = kinds[kind]
    keys(td, b, where)
    cache_control(b, where, seen)
    if kind == "tool_result" and isinstance(b.get("content"), list):
        for i, part in enumerate(b["content"]):
            block(part, f"{where}.content[{i}]", seen, TOOL_RESULT_PARTS)
        b = {k: v for k, v in b.items() if k != "content"}
    valid(td, b, where)


def body(req, n):
    seen = []
    where = f"body {n}"
    keys(mcp.MessageCreateParamsNonStreaming, req, where)
    hints = typing.get_type_hints(mcp.MessageCreateParamsNonStreaming)
    for field in ("model", "max_tokens", "temperature", "tool_choice", "stream"):
        if field in req:
            valid(hints[field], req[field], f"{where}.{field}")
    if "tool_choice" in req:
        kind = req["tool_choice"].get("type")
        td = {"auto": t.ToolChoiceAutoParam, "any": t.ToolChoiceAnyParam,
              "tool": t.ToolChoiceToolParam, "none": t.ToolChoiceNoneParam}.get(kind)
        if td is None:
            raise Mismatch(f"{where}.tool_choice: no type {kind!r}")
        keys(td, req["tool_choice"], f"{where}.tool_choice")
    for i, tool in enumerate(req.get("tools", [])):
        keys(t.ToolParam, tool, f"{where}.tools[{i}]")
        cache_control(tool, f"{where}.tools[{i}]", seen)
        valid(t.ToolParam, tool, f"{where}.tools[{i}]")
    system = req.get("system")
    if isinstance(system, list):
        for i, part in enumerate(system):
            block(part, f"{where}.system[{i}]", seen, {"text": t.TextBlockParam})
    elif system is not None:
        valid(str, system, f"{where}.system")
    for i, m in enumerate(req["messages"]):
        role = m.get("role") if isinstance(m, dict) else None
        td = {"user": t.UserMessageParam, "assistant": t.AssistantMessageParam}.get(role)
        if td is None:
            raise Mismatch(f"{where}.messages[{i}]: the role {role!r}, not user or assistant")
        keys(td, m, f"{where}.messages[{i}]")
        if isinstance(m["content"], str):
            continue
        for j, b in enumerate(m["content"]):
            block(b, f"{where}.messages[{i}].content[{j}]", seen)
    if len(seen) > 4:
        raise Mismatch(f"{where}: {len(seen)} breakpoints; the API takes at most 4")
    # A longer lifetime may not come after a shorter one.
    if "5m" in seen and "1h" in seen[seen.index("5m"):]:
        raise Mismatch(f"{where}: a 1h breakpoint after a 5m one: {seen}")
    return len(seen)


def main():
    with open(sys.argv[1]) as f:
        bodies = json.load(f)
    marks = 0
    try:
        for n, req in enumerate(bodies):
            marks += body(req, n)
    except Mismatch as e:
        print(f"not of the anthropic SDK's types: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"{len(bodies)} bodies, {marks} breakpoints: of the anthropic SDK's types")


if __name__ == "__main__":
    main()
