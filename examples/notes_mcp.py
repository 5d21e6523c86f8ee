"""A local MCP server in standard-library Python: the stdio transport by example.

MCP over stdio is JSON-RPC 2.0, one message per line: Pulse writes requests to the
program's stdin and reads answers from its stdout (stderr goes to Pulse's log). This
server keeps notes in a file and offers two tools, `add_note` and `find_notes`.

    export PULSE_MCP_STDIO=on
    pulse tools add-mcp notes --command "python3 examples/notes_mcp.py"
    pulse agents update scout --tools mcp:notes

The notes go to NOTES_FILE (`notes.jsonl` in the directory Pulse runs in when unset;
pass `--env NOTES_FILE` to `add-mcp` to set it, since the program gets a clean
environment).
"""

import json
import os
import sys

NOTES = os.environ.get("NOTES_FILE", "notes.jsonl")
TOOLS = [
    {
        "name": "add_note",
        "description": "Keep a note for later.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "What to keep"}},
            "required": ["text"],
        },
    },
    {
        "name": "find_notes",
        "description": "The notes that contain a word, newest first.",
        "inputSchema": {
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
        },
        # Marked read-only: Pulse lets agents call it without asking (add_note, which
        # says nothing, waits for its owner's approval unless a policy says otherwise).
        "annotations": {"readOnlyHint": True},
    },
]


def call(name, args):
    """A tool's answer: its text, and whether it failed (the model is told either way)."""
    if name == "add_note":
        try:
            with open(NOTES, "a") as f:
                f.write(json.dumps({"text": args["text"]}) + "\n")
        except OSError as e:
            return f"the note was not kept: {e}", True
        return "kept", False
    if name == "find_notes":
        try:
            with open(NOTES) as f:
                notes = [json.loads(line)["text"] for line in f if line.strip()]
        except FileNotFoundError:
            notes = []
        found = [n for n in reversed(notes) if args["word"].lower() in n.lower()]
        return "\n".join(found) or "no note has that word", False
    return f"no tool named {name}", True


def answer(request):
    """The result of one request, or None when there is no such method."""
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "notes", "version": "1.0"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        text, failed = call(params["name"], params.get("arguments") or {})
        return {"content": [{"type": "text", "text": text}], "isError": failed}
    if method == "ping":
        return {}
    return None


def reply(line):
    """The answer to one line, or None for a notification (such as
    notifications/initialized), which gets none."""
    try:
        request = json.loads(line)
    except ValueError as e:
        return {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": str(e)}}
    if "id" not in request:
        return None
    answered = {"jsonrpc": "2.0", "id": request["id"]}
    try:
        result = answer(request)
    except (KeyError, TypeError) as e:
        # A request without what it needs: said, and the server goes on.
        answered["error"] = {"code": -32602, "message": f"{type(e).__name__}: {e}"}
        return answered
    if result is None:
        answered["error"] = {"code": -32601, "message": f"no method {request.get('method')}"}
    else:
        answered["result"] = result
    return answered


for line in sys.stdin:
    if line.strip():
        out = reply(line)
        if out is not None:
            print(json.dumps(out), flush=True)
