#!/usr/bin/env python3
"""Checks the shape of the house, read from the sources (a ctest test runs it):

- layers: a file includes only files of its own floor or a lower one. datasets/ is the floor (errors, files, tensors,
  parameters, random generators, captions); vision/ (pixels to grid) and seq/ (grid to words) stand on it side by side
  and never include each other (the encoder never sees words, the decoder never sees pixels); train/ stands on both;
  tools/ (the CLI, benchmarks) on train/; tests/ on everything.
- no circles: no file reaches itself through its includes.
- no whole programs in one function: no function of the C++ sources is longer than --max-lines (200) lines.

Prints each problem on a line of its own and exits 1 when there is any; prints a summary and exits 0 otherwise.
"""
import argparse
import os
import re
import sys

FLOORS = {"datasets": 0, "vision": 1, "seq": 1, "train": 2, "tools": 3, "tests": 4}
SIDE_BY_SIDE = {("vision", "seq"), ("seq", "vision")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE_EXTENSIONS = (".hpp", ".cpp", ".h")


def sources(root):
    for folder in FLOORS:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            if "fuzz/corpus" in dirpath:
                continue
            for name in sorted(names):
                if name.endswith(SOURCE_EXTENSIONS):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def resolve(root, including, target):
    """The repository path an include names: relative to the including file first, then to the root (and to
    datasets/ for the public <sat/error.hpp>), as the compiler searches; None for a system header."""
    for base in (os.path.dirname(including), "", "datasets", "train"):
        path = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(os.path.join(root, path)):
            return path
    return None


def floor_of(path):
    return path.split(os.sep)[0]


def check_layers(root, files, problems):
    graph = {}
    for f in files:
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        graph[f] = []
        for target in INCLUDE.findall(text):
            path = resolve(root, f, target)
            if path is None:
                continue
            graph[f].append(path)
            a, b = floor_of(f), floor_of(path)
            if a not in FLOORS or b not in FLOORS:
                continue
            if FLOORS[b] > FLOORS[a] or (a, b) in SIDE_BY_SIDE:
                problems.append(f"{f}: includes {path}, a floor above it ({b} over {a})")
    # circles: depth-first search with colours
    state = {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                problems.append("include circle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif state.get(nxt) is None:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for f in files:
        if state.get(f) is None:
            visit(f, [])
    return sum(len(v) for v in graph.values())


def function_lengths(text):
    """(name, first line, lines) of each function defined at namespace level: a line at column 0 (or after a
    namespace's indentation of none) that opens a body, up to the brace that closes it."""
    lines = text.split("\n")
    out = []
    i = 0
    signature = re.compile(r"^[A-Za-z_][\w:<>,\s\*&\[\]]*?\b([\w:~]+)\s*\(")
    while i < len(lines):
        line = lines[i]
        m = signature.match(line)
        if m and not line.startswith(("namespace", "struct ", "class ", "enum ", "using ", "typedef ", "return ")):
            # the body opens on this line or a later line of the signature
            j = i
            while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
                j += 1
            if j < len(lines) and "{" in lines[j] and not lines[j].rstrip().endswith(";"):
                depth = 0
                k = j
                while k < len(lines):
                    code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|//.*', "", lines[k])
                    depth += code.count("{") - code.count("}")
                    if depth <= 0 and k >= j:
                        break
                    k += 1
                out.append((m.group(1), i + 1, k - i + 1))
                i = k + 1
                continue
        i += 1
    return out


def check_functions(root, files, max_lines, problems):
    count = 0
    longest = (0, "")
    for f in files:
        if not f.endswith(".cpp"):
            continue
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        for name, line, length in function_lengths(text):
            count += 1
            if length > longest[0]:
                longest = (length, f"{f}:{line} {name}")
            if length > max_lines and not f.startswith("tests" + os.sep):
                problems.append(f"{f}:{line}: {name} is {length} lines (more than {max_lines})")
    return count, longest


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--max-lines", type=int, default=200)
    args = parser.parse_args()
    root = os.path.normpath(args.root)
    files = list(sources(root))
    problems = []
    includes = check_layers(root, files, problems)
    functions, longest = check_functions(root, files, args.max_lines, problems)
    for p in problems:
        print(p)
    if problems:
        print(f"check-structure: {len(problems)} problem(s)")
        return 1
    print(f"check-structure: {len(files)} files, {includes} project includes, no upward include and no circle; "
          f"{functions} functions, none over {args.max_lines} lines outside tests/ (longest: {longest[1]}, "
          f"{longest[0]} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
