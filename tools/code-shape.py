#!/usr/bin/env python3
"""The shape of netwave's Rust code (#30): long functions and module import cycles.

    python3 tools/code-shape.py            # summary + every function over 80 lines + every cycle
    python3 tools/code-shape.py --max 120  # exit 1 if a non-test function is over 120 lines or a cycle exists

Why a script and not a crate: it must run on any commit (before/after numbers for a closing note) without
building anything, and python3 is already one of the tools the tests need (tools/deps.sh). It lexes Rust
just enough for this (comments, strings, raw strings, chars vs lifetimes, braces); it does not parse it.

What counts:
- A function is `fn name` to the closing brace of its body, both lines included. Test code is left out:
  files under a `tests/` directory (integration tests and the e2e workspace crates), items under
  `#[cfg(test)]` and functions marked `#[test]` / `#[tokio::test]`. Examples (the bench tools) are listed
  on their own and not counted, as #30 counted (38 over 80 lines on 305f3a2). Generated code: none is
  checked in as .rs.
- A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`) or an inline non-test `mod x { .. }`. Module A
  depends on module B when A names a path in B (`use crate::b::X`, `super::X`, `crate::b::f()` in code),
  resolved to the longest module prefix, and through one `use` alias in the named module (so `crate::X`
  re-exported by the root from `b` is a dependency on `b`, not on the root). An import cycle is a strongly
  connected set of two or more modules of one crate; a child that uses its parent while the parent uses
  it back is a cycle too (the parent's shared pieces belong in a module of their own).
"""

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------- lexing
def lex(src):
    """Tokens (kind, text, line) with comments and literal contents dropped."""
    toks = []
    i, n, line = 0, len(src), 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += src[i] == "\n"
                    i += 1
        elif (m := re.compile(r'(b|c)?r(#*)"').match(src, i)) and (
            i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")
        ):
            end = '"' + m.group(2)
            j = src.find(end, m.end())
            j = n if j < 0 else j + len(end)
            toks.append(("lit", "", line))
            line += src.count("\n", i, j)
            i = j
        elif c == '"' or (c in "bc" and src.startswith('"', i + 1) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_"))):
            j = i + (2 if c != '"' else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            toks.append(("lit", "", line))
            line += src.count("\n", i, j + 1)
            i = j + 1
        elif c == "'" or (c == "b" and src.startswith("'", i + 1) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_"))):
            k = i + (2 if c == "b" else 1)
            m = re.compile(r"(\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'\n])'").match(src, k)
            if m:  # char literal
                toks.append(("lit", "", line))
                i = m.end()
            else:  # lifetime or label
                m = re.compile(r"'[A-Za-z_][A-Za-z0-9_]*").match(src, i)
                toks.append(("lifetime", m.group(0) if m else "'", line))
                i = m.end() if m else i + 1
        elif c.isalpha() or c == "_":
            m = re.compile(r"r#[A-Za-z_][A-Za-z0-9_]*|[A-Za-z_][A-Za-z0-9_]*").match(src, i)
            toks.append(("ident", m.group(0).removeprefix("r#"), line))
            i = m.end()
        elif c.isdigit():
            m = re.compile(r"[0-9][0-9A-Za-z_]*(\.[0-9][0-9A-Za-z_]*)?").match(src, i)
            toks.append(("lit", "", line))
            i = m.end()
        elif src.startswith("::", i):
            toks.append(("punct", "::", line))
            i += 2
        else:
            toks.append(("punct", c, line))
            i += 1
    return toks


def matching(toks, i):
    """Index of the bracket closing the one at toks[i]."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = [pairs[toks[i][1]]]
    j = i + 1
    while j < len(toks) and stack:
        t = toks[j][1] if toks[j][0] == "punct" else None
        if t in pairs:
            stack.append(pairs[t])
        elif t and stack and t == stack[-1]:
            stack.pop()
        j += 1
    return j - 1


TEST_ATTR = re.compile(r"^(cfg\(test\)|test|[A-Za-z_:]*::test(\(.*\))?)$")


# --------------------------------------------------------------------------------------------- walking
class FileScan:
    def __init__(self, path, module, crate, is_test_file):
        self.path, self.module, self.crate = path, module, crate
        self.functions = []  # (lines, module path, name, path, line)
        self.uses = []  # (module, [segments]) absolute-ish paths named from that module
        self.aliases = defaultdict(dict)  # module -> {name: [segments]}
        self.inline_modules = []  # module paths
        self.test_child_files = set()  # `#[cfg(test)] mod x;`
        self.child_files = set()
        toks = lex(open(path, encoding="utf-8").read())
        self.walk(toks, 0, len(toks), module, is_test_file, [])

    def walk(self, toks, i, end, module, in_test, fn_stack):
        attrs = []
        while i < end:
            kind, text, line = toks[i]
            if text == "#" and kind == "punct":
                j = i + 1
                if j < end and toks[j][1] == "!":
                    j += 1
                if j < end and toks[j][1] == "[":
                    close = matching(toks, j)
                    attrs.append("".join(t[1] for t in toks[j + 1 : close]))
                    i = close + 1
                    continue
            test_item = in_test or any(TEST_ATTR.match(a) for a in attrs)
            if kind == "ident" and text == "use":
                close = i
                while close < end and toks[close][1] != ";":
                    close += 1
                if not test_item:
                    for path in expand_use(toks[i + 1 : close]):
                        if path[0] not in ("crate", "super", "self", "::"):
                            path = ["self"] + path  # a child module's path, or an external crate (dropped later)
                        self.record_path(module, path, alias=True)
                attrs, i = [], close + 1
                continue
            if kind == "ident" and text == "mod" and i + 1 < end and toks[i + 1][0] == "ident":
                name = toks[i + 1][1]
                if i + 2 < end and toks[i + 2][1] == ";":
                    (self.test_child_files if test_item else self.child_files).add(name)
                    attrs, i = [], i + 3
                    continue
                if i + 2 < end and toks[i + 2][1] == "{":
                    close = matching(toks, i + 2)
                    sub = module + [name]
                    if not test_item:
                        self.inline_modules.append(sub)
                    self.walk(toks, i + 3, close, sub, test_item, [])
                    attrs, i = [], close + 1
                    continue
            if kind == "ident" and text == "fn" and i + 1 < end and toks[i + 1][0] == "ident":
                name = toks[i + 1][1]
                j = i + 2
                while j < end and toks[j][1] not in ("{", ";"):
                    if toks[j][1] in ("(", "["):
                        j = matching(toks, j)
                    j += 1
                if j < end and toks[j][1] == "{":
                    close = matching(toks, j)
                    if not test_item:
                        self.functions.append((toks[close][2] - line + 1, module, name, self.path, line))
                    self.walk(toks, j + 1, close, module, test_item, fn_stack + [name])
                    attrs, i = [], close + 1
                    continue
                attrs, i = [], j + 1
                continue
            if kind == "punct" and text == "{":
                close = matching(toks, i)
                # an impl/trait/struct body or a block: same module; a test attribute covers it whole
                self.walk(toks, i + 1, close, module, test_item, fn_stack)
                attrs, i = [], close + 1
                continue
            if kind == "punct" and text == ";":
                attrs = []
            if kind == "ident" and not test_item:
                if i + 1 < end and toks[i + 1][1] == "::" and (i == 0 or toks[i - 1][1] != "::"):
                    # `crate::`/`super::`/`self::` paths, and `child::x` (kept only if `child` is a module)
                    segs, j = [text] if text in ("crate", "super", "self") else ["self", text], i + 1
                    while j + 1 < end and toks[j][1] == "::" and toks[j + 1][0] == "ident":
                        segs.append(toks[j + 1][1])
                        j += 2
                    self.record_path(module, segs, alias=False)
                    i = j
                    continue
            i += 1

    def record_path(self, module, segs, alias):
        if segs[0] not in ("crate", "super", "self"):
            if alias and segs:
                pass  # an external crate or a sibling re-export: not this crate's module graph
            return
        absolute = resolve_relative(module, segs)
        if absolute is None:
            return
        self.uses.append((tuple(module), tuple(absolute)))
        if alias and absolute and absolute[-1] not in ("*", "self"):
            self.aliases[tuple(module)][absolute[-1]] = tuple(absolute)


def resolve_relative(module, segs):
    if segs[0] == "crate":
        return list(segs[1:])
    base = list(module)
    k = 0
    while k < len(segs) and segs[k] in ("super", "self"):
        if segs[k] == "super":
            if not base:
                return None
            base.pop()
        k += 1
    return base + list(segs[k:])


def expand_use(toks):
    """`a::{b, c::{d as e}, *}` -> [[a,b],[a,c,d],[a,*]] (renames keep the original name)."""
    out = []

    def tree(i, prefix):
        segs = list(prefix)
        while i < len(toks):
            t = toks[i][1]
            if t == "{":
                close = matching(toks, i)
                j = i + 1
                while j < close:
                    j = tree(j, segs)
                    if j < close and toks[j][1] == ",":
                        j += 1
                return close + 1
            if t in (",", "}"):
                break
            if t == "as":
                i += 2
                continue
            if t == "::":
                i += 1
                continue
            segs.append("*" if t == "*" else t)
            i += 1
        if len(segs) > len(prefix):
            out.append(segs)
        return i

    tree(0, [])
    return out


# -------------------------------------------------------------------------------------------- crates
def crates():
    meta = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=ROOT, capture_output=True, text=True,
    )
    if meta.returncode == 0:
        import json

        for pkg in json.loads(meta.stdout)["packages"]:
            yield pkg["name"], os.path.dirname(pkg["manifest_path"])
        return
    for dirpath, _, files in os.walk(ROOT):  # no cargo: every Cargo.toml with a package
        if "target" in dirpath.split(os.sep) or "/." in dirpath:
            continue
        if "Cargo.toml" in files and "[package]" in open(os.path.join(dirpath, "Cargo.toml")).read():
            yield os.path.basename(dirpath), dirpath


def scan_crate(name, cdir):
    """Every source file of the crate, each root (lib, main, bin, example) its own module tree."""
    rel_in_ws = os.path.relpath(cdir, ROOT)
    crate_is_test = rel_in_ws.split(os.sep)[0] == "tests"
    scans = []
    for sub in ("src", "examples", "benches", "tests"):
        d = os.path.join(cdir, sub)
        if not os.path.isdir(d):
            continue
        for dirpath, dirs, files in os.walk(d):
            dirs[:] = [x for x in dirs if x != "target"]
            for f in files:
                if not f.endswith(".rs"):
                    continue
                p = os.path.join(dirpath, f)
                relsrc = os.path.relpath(p, d)
                parts = relsrc[:-3].split(os.sep)
                if sub == "src":
                    if parts in (["lib"], ["main"]) or parts[0] == "bin":
                        tree = "::".join(parts)
                        module = []
                    else:
                        tree = "lib" if os.path.exists(os.path.join(d, "lib.rs")) else "main"
                        module = parts[:-1] if parts[-1] == "mod" else parts
                else:
                    tree = f"{sub}/{parts[0]}"
                    module = parts[1:]
                    if module and module[-1] == "mod":
                        module = module[:-1]
                is_test = crate_is_test or sub in ("tests", "benches")
                scans.append((tree, FileScan(os.path.relpath(p, ROOT), module, name, is_test)))
    # files declared `#[cfg(test)] mod x;` are test code
    test_files = set()
    for tree, s in scans:
        for child in s.test_child_files:
            test_files.add((tree, tuple(s.module + [child])))
    result = []
    for tree, s in scans:
        if (tree, tuple(s.module)) in test_files:
            s.functions = []
            s.uses = []
        result.append((tree, s))
    return result


def cycles(scans):
    by_tree = defaultdict(list)
    for tree, s in scans:
        by_tree[(s.crate, tree)].append(s)
    found = []
    for (_, tree), ss in sorted(by_tree.items()):
        modules = set()
        aliases = {}
        for s in ss:
            modules.add(tuple(s.module))
            modules.update(tuple(m) for m in s.inline_modules)
            for m, al in s.aliases.items():
                aliases.setdefault(m, {}).update(al)

        def target(path, depth=0):
            best = ()
            for k in range(len(path), -1, -1):
                if tuple(path[:k]) in modules:
                    best = tuple(path[:k])
                    break
            rest = path[len(best) :]
            if rest and depth < 3 and rest[0] in aliases.get(best, {}):
                via = aliases[best][rest[0]]
                if via != tuple(path):
                    return target(list(via) + list(rest[1:]), depth + 1)
            return best

        edges = defaultdict(set)
        for s in ss:
            for src, path in s.uses:
                if len(path) > len(src) and path[: len(src)] == src and src + path[len(src) : len(src) + 1] not in modules:
                    # `self::x::..` where x is no module here: an external crate, a type, an enum variant
                    if not (path[len(src)] in aliases.get(src, {})):
                        continue
                dst = target(list(path))
                if dst != src and src in modules:
                    edges[src].add(dst)
        # sibling cycles: an edge between modules neither of which contains the other, seen from their
        # nearest common parent (`a::x -> b::y` is `a -> b`)
        sib = defaultdict(set)
        for src, dsts in edges.items():
            for dst in dsts:
                k = 0
                while k < min(len(src), len(dst)) and src[k] == dst[k]:
                    k += 1
                if k < len(src) and k < len(dst):
                    sib[src[: k + 1]].add(dst[: k + 1])
        for comp in scc(modules, sib):
            if len(comp) > 1:
                found.append((ss[0].crate, tree, sorted(comp), sib, "sibling"))
        # a parent and a child that use each other (the parent's shared pieces want a module of their own)
        for comp in scc(modules, edges):
            if len(comp) > 1:
                up = {m: {d for d in edges[m] if d in comp and m[: len(d)] == d} for m in comp}
                if any(up.values()):
                    found.append((ss[0].crate, tree, sorted(comp), edges, "up"))
    return found


def scc(nodes, edges):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
            out.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def modname(m):
    return "::".join(m) if m else "(root)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", type=int, default=80, help="list functions longer than this (default 80)")
    ap.add_argument("--max", type=int, help="exit 1 if any function is longer than this or a cycle exists")
    args = ap.parse_args()

    all_scans, funcs, examples = [], [], []
    for name, cdir in sorted(crates()):
        scans = scan_crate(name, cdir)
        all_scans.extend(scans)
        for tree, s in scans:
            (examples if tree.startswith("examples/") else funcs).extend(s.functions)
    funcs.sort(key=lambda f: (-f[0], f[3], f[4]))
    over80 = [f for f in funcs if f[0] > 80]
    over120 = [f for f in funcs if f[0] > 120]
    found = cycles(all_scans)
    cyc = [c for c in found if c[4] == "sibling"]
    up = [c for c in found if c[4] == "up"]

    print(f"non-test functions: {len(funcs)}; over 80 lines: {len(over80)}; over 120 lines: {len(over120)}")
    if funcs:
        f = funcs[0]
        print(f"longest: {f[2]} ({f[0]} lines) {f[3]}:{f[4]}")
    print(f"import cycles between sibling modules: {len(cyc)}; parent/child modules using each other: {len(up)}")
    print()
    print(f"functions over {args.list} lines:")
    for n, _, fname, path, line in (f for f in funcs if f[0] > args.list):
        print(f"  {n:4}  {fname:32} {path}:{line}")
    print()
    examples.sort(key=lambda f: (-f[0], f[3], f[4]))
    print(f"examples (bench tools, not counted) over {args.list} lines:")
    for n, _, fname, path, line in (f for f in examples if f[0] > args.list):
        print(f"  {n:4}  {fname:32} {path}:{line}")
    print()
    for title, group in (("import cycles", cyc), ("parent and child modules using each other", up)):
        print(f"{title} (module -> what it uses inside the cycle):")
        for crate, tree, comp, edges, _ in group:
            print(f"  {crate} [{tree}]")
            members = set(comp)
            for m in comp:
                inside = sorted(modname(d) for d in edges.get(m, ()) if d in members)
                print(f"    {modname(m)} -> {', '.join(inside)}")
        print()
    if args.max is not None and (any(f[0] > args.max for f in funcs) or cyc):
        sys.exit(1)


if __name__ == "__main__":
    main()
