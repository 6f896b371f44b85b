#!/usr/bin/env python3
"""Files that import each other in a circle, in every crate of the workspace.

An edge A -> B: a path in A's code (a `use` line, braces expanded, or a
path anywhere in its code outside comments and strings) that starts with
`crate::`, `super::` or `self::` and names B's module or an item B
defines, or (a parent's edge) a path in A that starts with a module A
declares (`mod x;` then `x::Y`; issue #53). `mod x;` declarations
themselves, `pub use` re-exports and visibilities (`pub(super)`) are not
edges; nor are `$crate::` paths in a macro's body (they are its
caller's) or paths inside a `#[cfg(test)] mod` block of a file. Circles are
the strongly connected components of more than one file. Prints each with
the lines that make its edges; exits 1 when there is one (issue #45: a
reader must see each room's ground floor from its file names).

    python3 scripts/import-circles.py [ROOT] [--no-parent-edges]
"""

import os
import re
import sys

# `$crate::` in a macro's body is its caller's path, not its file's.
# A parent's edges to the children it declares count (issue #53);
# `--no-parent-edges` leaves them out, as the check did before.
PARENT_EDGES = "--no-parent-edges" not in sys.argv
VISIBILITY = re.compile(r"\bpub\s*\(\s*(?:in\s+[^)]*|crate|super|self)\s*\)")
PATH = re.compile(r"(?<!\$)\b(crate|super|self)((?:::(?:super|self|[A-Za-z_][A-Za-z0-9_]*))*)(::\{)?")


def strip(text):
    """The code without comments, string and char literals (same length, line breaks kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 4]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)

    def parse(s, i, prefix):
        paths, cur = [], ""
        while i < len(s):
            ch = s[i]
            if ch == "{":
                inner, i = parse(s, i + 1, prefix + cur)
                paths.extend(inner)
                cur = None
            elif ch == ",":
                if cur:
                    paths.append(prefix + cur)
                cur = ""
                i += 1
            elif ch == "}":
                if cur:
                    paths.append(prefix + cur)
                return paths, i + 1
            else:
                cur = (cur or "") + ch
                i += 1
        if cur:
            paths.append(prefix + cur)
        return paths, i

    return parse(tree, 0, "")[0]


def crate_modules(src):
    """module path (tuple) -> file, for a crate's src folder."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                key = ()
            elif rel[-1] == "mod":
                key = tuple(rel[:-1])
            elif rel[0] == "bin":
                continue
            else:
                key = tuple(rel)
            mods.setdefault(key, full)
    return mods


def edges_of(mods):
    files = {v: k for k, v in mods.items()}
    edges = {}
    for f, here in files.items():
        code = strip(open(f, encoding="utf-8").read())
        # A visibility (`pub(super)`, `pub(in crate::x)`) names who may see
        # an item, not what the file uses.
        code = VISIBILITY.sub(lambda m: " " * len(m.group(0)), code)
        lines = code.split("\n")
        found = {}
        for m in re.finditer(r"\buse\s+([^;]*);", code):
            line = code.count("\n", 0, m.start()) + 1
            for p in expand(m.group(1)):
                found.setdefault(p, line)
        for m in PATH.finditer(code):
            line = code.count("\n", 0, m.start()) + 1
            found.setdefault(m.group(0).rstrip("{").rstrip(":"), line)
        # A path that starts with a module this file declares (`mod state;`
        # then `use state::Sim;` or `state::Sim::new()`) is an edge to it.
        # A re-export (`pub use child::Item;`) publishes, it does not use.
        used = re.sub(r"\bpub\s+use\s+[^;]*;", lambda m: re.sub(r"[^\n]", " ", m.group(0)), code)
        for child in [] if not PARENT_EDGES else re.findall(r"^\s*(?:pub\s*(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code, re.M):
            for m in re.finditer(r"(?<![:\w])" + child + r"((?:::[A-Za-z_]\w*)+)", used):
                line = code.count("\n", 0, m.start()) + 1
                found.setdefault("self::" + child + m.group(1), line)
            for m in re.finditer(r"(?<!pub )\buse\s+([^;]*);", code):
                line = code.count("\n", 0, m.start()) + 1
                for p in expand(m.group(1)):
                    if p.split("::")[0] == child:
                        found.setdefault("self::" + p, line)
        for path, line in found.items():
            segs = [s for s in path.split("::") if s]
            if not segs or segs[0] not in ("crate", "super", "self"):
                continue
            # `super::` inside an inline `mod x { ... }` (tests) is the file itself.
            cur = list(here)
            if segs[0] == "crate":
                cur, segs = [], segs[1:]
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    if not cur:
                        break
                    cur = cur[:-1]
                segs = segs[1:]
            target = tuple(cur)
            for k in range(len(segs), -1, -1):
                if tuple(cur + segs[:k]) in mods:
                    target = tuple(cur + segs[:k])
                    break
            dest = mods.get(target)
            if dest and dest != f and not inline_test(lines, line):
                edges.setdefault(f, {}).setdefault(dest, line)
    return edges


def inline_test(lines, line):
    """Whether `line` lies in a `#[cfg(test)] mod ... {` block of its file."""
    depth_at_test = None
    depth = 0
    for i, text in enumerate(lines[:line], start=1):
        if depth_at_test is None and re.match(r"\s*mod\s+\w+\s*\{", text) and i > 1 and "cfg(test)" in lines[i - 2]:
            depth_at_test = depth
        depth += text.count("{") - text.count("}")
        if depth_at_test is not None and depth <= depth_at_test and i < line:
            depth_at_test = None
    return depth_at_test is not None


def circles(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    found = 0
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("target", ".git", "node_modules") and not d.startswith(".")]
        if "Cargo.toml" in files and os.path.isdir(os.path.join(dirpath, "src")):
            mods = crate_modules(os.path.join(dirpath, "src"))
            edges = edges_of(mods)
            for comp in circles(edges):
                found += 1
                rel = lambda p: os.path.relpath(p, root)
                print(f"circle: {', '.join(rel(c) for c in comp)}")
                for a in comp:
                    for b, line in sorted(edges.get(a, {}).items()):
                        if b in comp:
                            print(f"  {rel(a)}:{line} -> {rel(b)}")
    if found:
        print(f"{found} circle(s) of files importing each other", file=sys.stderr)
        return 1
    print("no circle of files importing each other")
    return 0


if __name__ == "__main__":
    sys.exit(main())
