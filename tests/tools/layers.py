#!/usr/bin/env python3
"""The layer order of tpgen's sources (docs/architecture.md), checked two ways.

  1 front ends      cli/, cli/bench/
  2 pipeline+models core/ (its own files), core/models/
  3 formats, I/O    core/formats/, core/dist/, core/image/
  4 plans           plans/
  5 kernels         kernels/, kernels/cpu/, kernels/cuda/

A file may include and call files of its own layer or of a lower one (a
larger number), never of a higher one. Checked on the `#include "..."` lines
of every source file, and, given a build folder, on the calls between the
objects (`nm`: a symbol one object uses and another defines). Inside the
front ends, the pipeline and the models no two files may call each other
in a circle (the backends' vtable registrations in kernels/cpu and
kernels/cuda are the one allowed exception).

Usage: layers.py ROOT [BUILD]   prints one line per violation, exits 1 on any.
"""
import collections
import os
import re
import subprocess
import sys

LAYERS = [  # longest prefix first
    ("cli/bench/", 1, "front ends"), ("cli/", 1, "front ends"),
    ("core/models/", 2, "pipeline and models"),
    ("core/formats/", 3, "formats and weights"), ("core/dist/", 3, "formats and weights"),
    ("core/image/", 3, "formats and weights"),
    ("core/", 2, "pipeline and models"),
    ("plans/", 4, "plans"),
    ("kernels/", 5, "kernels"),
]
CYCLE_FREE = ("cli/", "core/")          # no call circles between files here
SOURCE = re.compile(r"\.(c|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def layer(path):
    for prefix, rank, name in LAYERS:
        if path.startswith(prefix):
            return rank, name
    return None


def sources(root):
    for top in ("cli", "core", "plans", "kernels"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if SOURCE.search(f):
                    yield os.path.relpath(os.path.join(d, f), root)


def check_includes(root):
    bad = []
    for f in sources(root):
        lf = layer(f)
        with open(os.path.join(root, f), errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                cands = [os.path.normpath(os.path.join(os.path.dirname(f), inc)), os.path.normpath(inc)]
                target = next((c for c in cands if os.path.exists(os.path.join(root, c))), None)
                if target is None:
                    bad.append(f"{f}:{n}: includes \"{inc}\", which is not in the tree")
                    continue
                lt = layer(target)
                if lt and lf and lt[0] < lf[0]:
                    bad.append(f"{f}:{n}: includes {target}: layer {lf[0]} ({lf[1]}) may not include layer "
                               f"{lt[0]} ({lt[1]})")
    return bad


def call_graph(build):
    defs, uses = {}, collections.defaultdict(set)
    for d, _, files in os.walk(build):
        for f in files:
            if not f.endswith(".o"):
                continue
            obj = os.path.join(d, f)
            src = os.path.relpath(obj, build)[:-2]
            if layer(src) is None or src == "cli/main":
                continue
            out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                p = line.split()
                if len(p) == 3 and p[1] in "TDBR":
                    defs[p[2]] = src
                elif len(p) == 2 and p[0] == "U":
                    uses[src].add(p[1])
    graph = collections.defaultdict(dict)
    for src, syms in uses.items():
        for s in sorted(syms):
            if s in defs and defs[s] != src:
                graph[src].setdefault(defs[s], s)
    return graph


def cycles(graph, keep):
    """Strongly connected components of more than one file among `keep`."""
    sys.setrecursionlimit(100000)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if not keep(w):
                continue
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

    for v in sorted(graph):
        if keep(v) and v not in index:
            visit(v)
    return out


def check_calls(build):
    graph = call_graph(build)
    bad = []
    for src in sorted(graph):
        for dst, sym in sorted(graph[src].items()):
            ls, ld = layer(src), layer(dst)
            if ld[0] < ls[0]:
                bad.append(f"{src}.o calls {sym} of {dst}: layer {ls[0]} ({ls[1]}) may not call layer "
                           f"{ld[0]} ({ld[1]})")
    for comp in cycles(graph, lambda f: f.startswith(CYCLE_FREE)):
        bad.append("call circle: " + " -> ".join(comp))
    return bad, sum(len(v) for v in graph.values())


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root = sys.argv[1]
    bad = check_includes(root)
    n_edges = 0
    if len(sys.argv) == 3:
        more, n_edges = check_calls(sys.argv[2])
        bad += more
    for b in bad:
        print(b)
    print(f"# {len(list(sources(root)))} sources, {n_edges} call edges between objects, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
