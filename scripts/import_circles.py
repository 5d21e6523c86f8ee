"""Import circles between the production files of the workspace's crates.

Usage: import_circles.py [--list | --dir SRC]. Reads every crate's `src/` (tests modules and comments
left out), resolves each `crate::`, `super::` and `self::` path to the file that defines
the item (through `pub use` re-exports), and finds the groups of files that reach one
another (strongly connected components). A file reading its own ancestors' items is its
module's structure, not a circle.

Each circle still known is listed in scripts/import_circles.known, one per line, its
files sorted and joined by spaces after the crate's directory. The check fails on a
circle not listed there (a new one: move the shared piece down to where both can use
it) and on a listed one that is gone (take it off the list, so it cannot come back).
"""

import os
import re
import sys
from collections import defaultdict

CRATES = ["shared/src", "cli/src", "sim/src", "ui/src", "gateway/src", "egress/src",
          "signatures/src", "sqlite-log/src"]


def circles(root):
    files = {}
    for dp, dn, fn in os.walk(root):
        for f in fn:
            if f.endswith('.rs'):
                p = os.path.join(dp, f)
                files[os.path.relpath(p, root)] = open(p).read()
    def module_path(rel):
        parts = rel[:-3].split('/')
        if parts[-1] in ('mod', 'lib', 'main'):
            parts = parts[:-1]
        return tuple(parts)
    mods = {module_path(r): r for r in files}
    def is_hub(rel):
        return rel.endswith('mod.rs') or rel in ('lib.rs', 'main.rs')
    def prod(src):
        i = src.find('#[cfg(test)]\nmod tests')
        src = src if i < 0 else src[:i]
        # Comments (doc links among them) are not uses.
        return re.sub(r'(?m)^\s*//.*$|\s//\s.*$', '', src)
    DEF = r'\b(?:fn|struct|enum|trait|type|const|static|union)\s+{}\b|macro_rules!\s*{}\b'
    def defines(rel, name):
        return re.search(DEF.format(name, name), prod(files[rel])) is not None
    def use_statements(src):
        # 'pub use ...;' statements, braces included
        for m in re.finditer(r'pub(?:\([^)]*\))?\s+use\s+([^;]+);', src):
            yield m.group(1)
    def expand(stmt):
        # yields full paths (as lists) from a use tree
        stmt = re.sub(r'\s+', '', stmt)
        def walk(prefix, s):
            if '{' not in s:
                for part in split_top(s):
                    seg = part.split(' as ')[0]
                    yield prefix + [x for x in seg.split('::') if x]
                return
            i = s.index('{')
            head = [x for x in s[:i].split('::') if x]
            inner = s[i+1:s.rindex('}')]
            for part in split_top(inner):
                yield from walk(prefix + head, part)
        yield from walk([], stmt)
    def split_top(s):
        depth = 0; cur = ''; out = []
        for ch in s:
            if ch == '{': depth += 1
            if ch == '}': depth -= 1
            if ch == ',' and depth == 0:
                out.append(cur); cur = ''
            else:
                cur += ch
        if cur: out.append(cur)
        return out
    def base_of(cur, hub, head):
        if head == 'crate': return ()
        if head == 'self': return cur
        # super
        return cur[:-1]
    def resolve(path, seen=0):
        """file that defines the item at absolute module path `path`"""
        for n in range(len(path), -1, -1):
            if tuple(path[:n]) in mods:
                f = mods[tuple(path[:n])]
                rest = path[n:]
                if not rest or not is_hub(f) or seen > 5:
                    return f
                name = rest[0]
                if defines(f, name):
                    return f
                # re-exported?
                cur = tuple(path[:n])
                for stmt in use_statements(prod(files[f])):
                    for full in expand(stmt):
                        if full and full[-1] == name:
                            head = full[0]
                            if head in ('crate', 'self', 'super'):
                                b = base_of(cur, True, head); tail = full[1:]
                                while tail and tail[0] == 'super':
                                    b = b[:-1]; tail = tail[1:]
                            else:
                                b = cur; tail = full
                            return resolve(list(b) + tail, seen + 1)
                return f
        return None
    edges = defaultdict(set)
    for rel, src in files.items():
        src = prod(src)
        cur = module_path(rel)
        hub = is_hub(rel)
        here = cur if hub else cur[:-1]   # the module whose children `self::` names... 
        # in a non-hub file foo.rs, `self` = foo module, `super` = parent
        selfmod = cur
        for m in re.finditer(r'\b(crate|super|self)((?:::(?:\w+|\{[^;]*?\}))+)', src):
            head, rest = m.group(1), m.group(2)
            for full in expand(head + rest):
                h = full[0]; tail = full[1:]
                if h == 'crate': b = ()
                elif h == 'self': b = selfmod
                else: b = selfmod[:-1]
                while tail and tail[0] == 'super':
                    b = b[:-1]; tail = tail[1:]
                t = resolve(list(b) + tail)
                # A file reading its own ancestors' items (`super::`) is its module's
                # structure, not a circle between files.
                if t and t != rel and not (is_hub(t) and cur[:len(module_path(t))] == module_path(t)):
                    edges[rel].add(t)
    index = {}; low = {}; stack = []; on = set(); sccs = []; c = [0]
    def strong(v):
        index[v] = low[v] = c[0]; c[0] += 1; stack.append(v); on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: sccs.append(sorted(comp))
    for v in sorted(files):
        if v not in index: strong(v)
    return sccs


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ws = os.path.dirname(here)
    found = set()
    for crate in CRATES:
        root = os.path.join(ws, crate)
        if not os.path.isdir(root):
            continue
        for comp in circles(root):
            found.add(crate + ": " + " ".join(comp))
    if "--dir" in sys.argv:
        root = sys.argv[sys.argv.index("--dir") + 1]
        for comp in circles(root):
            print(" ".join(comp))
        return
    if "--list" in sys.argv:
        print("\n".join(sorted(found)))
        return
    with open(os.path.join(here, "import_circles.known")) as f:
        known = {l.strip() for l in f if l.strip() and not l.startswith("#")}
    new, gone = sorted(found - known), sorted(known - found)
    for c in new:
        print(f"a new import circle: {c}; move the piece both files use down to where "
              "both can use it", file=sys.stderr)
    for c in gone:
        print(f"no longer a circle: {c}; take it off scripts/import_circles.known",
              file=sys.stderr)
    if new or gone:
        sys.exit(1)
    if found:
        print(f"{len(found)} import circles, all known: " + "; ".join(sorted(found)))
    else:
        print("no import circle")


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main()
