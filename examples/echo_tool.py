"""A Pulse HTTP tool in 30 lines of standard-library Python: the protocol by example.

Pulse POSTs one JSON request per action:
  {"action_id", "attempt", "event": {...}, "agent": {...},
   "heartbeat": {"id", "beats": {"beat", "since_last"}, ...}, "tool_config": {...}}
and reads back:
  {"success": true|false, "output": ..., "new_events": [{"type", "payload", "priority"}],
   "usage": {...}, "error": "..."}
Events in new_events are appended to the agent's log and processed in the same heartbeat.

This one logs what it receives and, for NOTE events, emits a SUMMARY event.
Run: python3 examples/echo_tool.py 8765
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Tool(BaseHTTPRequestHandler):
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        event, beats = request["event"], request["heartbeat"]["beats"]
        print(f"beat {beats['beat']} (since_last {beats['since_last']}): {event['type']} {event['payload']}", flush=True)
        answer = {"success": True, "output": {"seen": event["type"]}}
        if event["type"] == "NOTE":
            answer["new_events"] = [{"type": "SUMMARY", "payload": {"of": event["id"]}, "priority": 3}]
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8765), Tool).serve_forever()
