"""Checks Telegram updates against python-telegram-bot's own types.

Usage: check_telegram.py FILE, where FILE holds a JSON array of updates as a test sends
them to Pulse's receiver. Each is read with `telegram.Update.de_json`; every object in
it (the update, its message, the message's sender, chat, entities, attachments, a
button press) must be one the library knows whole: a key it does not know is kept in
the object's `api_kwargs`, and is a mismatch here. Prints how many updates and objects
it checked; exits 1 with the first mismatch's place.
"""

import json
import sys

from telegram import TelegramObject, Update


class Mismatch(Exception):
    pass


def walk(obj, where, seen):
    if isinstance(obj, TelegramObject):
        seen[0] += 1
        if obj.api_kwargs:
            raise Mismatch(f"{where}: {type(obj).__name__} does not know {sorted(obj.api_kwargs)}")
        for name in obj.__slots__ if hasattr(obj, "__slots__") else ():
            if name.startswith("_"):
                continue
            walk(getattr(obj, name, None), f"{where}.{name}", seen)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            walk(item, f"{where}[{i}]", seen)


def main():
    with open(sys.argv[1]) as f:
        updates = json.load(f)
    seen = [0]
    try:
        for i, data in enumerate(updates):
            update = Update.de_json(data, None)
            if update is None or update.update_id != data["update_id"]:
                raise Mismatch(f"update {i}: not read as an update")
            walk(update, f"update {i}", seen)
    except (Mismatch, KeyError, TypeError, ValueError) as e:
        print(f"mismatch: {e}")
        sys.exit(1)
    print(f"{len(updates)} updates, {seen[0]} objects: each known to python-telegram-bot")


if __name__ == "__main__":
    main()
