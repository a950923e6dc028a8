#!/usr/bin/env python3
"""scripts/check-layering passes on the tree and fails, naming the edge, when
the graph forbids an edge the tree has (an include, a link, a `never` rule) or
when the graph itself is malformed. Run by ctest (LayeringCheck*)."""

import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts", "check-layering")
DOC = os.path.join(ROOT, "docs", "architecture.md")


def run(doc_text=None):
    with tempfile.TemporaryDirectory(prefix="granary-test-layering-") as tmp:
        args = [CHECK]
        if doc_text is not None:
            doc = os.path.join(tmp, "architecture.md")
            with open(doc, "w", encoding="utf-8") as f:
                f.write(doc_text)
            args += ["--doc", doc]
        return subprocess.run(args, capture_output=True, text=True, timeout=120)


def edit_line(text, component, column, new_value):
    """The doc with `column` (1 paths, 2 targets, 3 uses) of `component` replaced."""
    out = []
    for line in text.splitlines(keepends=True):
        fields = line.rstrip("\n").split("|")
        if len(fields) == 4 and fields[0].strip() == component:
            fields[column] = f" {new_value} "
            line = "|".join(fields) + "\n"
        out.append(line)
    return "".join(out)


def expect(result, code, pattern, what):
    output = result.stdout + result.stderr
    if result.returncode != code or not re.search(pattern, output):
        print(f"FAIL {what}: exit {result.returncode} (want {code}), output:\n{output}")
        return False
    print(f"ok   {what}")
    return True


def main():
    text = open(DOC, encoding="utf-8").read()
    uses_of_cli = re.search(r"^cli\s*\|[^|]*\|[^|]*\|([^\n]*)$", text, re.M).group(1).split()
    ok = expect(run(), 0, r"within the graph", "the tree as it is")
    # The CLI includes and links the store: forbid it.
    ok &= expect(run(edit_line(text, "cli", 3, " ".join(u for u in uses_of_cli if u != "store"))),
                 1, r"cli/src/\S+: cli includes store/include/granary/store/open_store\.h "
                 r"of store.*\n(.*\n)*link: granary_cli \(cli\) links granary_store \(store\)",
                 "an include and a link the graph forbids")
    # A never rule the CLI breaks (it reaches hiredis through the store).
    ok &= expect(run(text.replace("never     | granary_client granary_native",
                                  "never     | granary_cli granary_client granary_native")),
                 1, r"link: granary_cli reaches PkgConfig::HIREDIS, which it must never link: "
                 r"granary_cli -> granary_store -> PkgConfig::HIREDIS", "a never rule")
    # A library left out of the graph.
    ok &= expect(run(edit_line(text, "posix", 2, "-")), 1,
                 r"link: library granary_posix is in no component", "a library in no component")
    # A component that is not one folder, and a folder that is no component.
    ok &= expect(run(edit_line(text, "client", 1, "client/include/ client/src/")), 1,
                 r"layering block: client is client/include/ client/src/: a component is one "
                 r"top-level folder", "a component of two paths")
    ok &= expect(run(edit_line(text, "client", 1, "clients/")), 1,
                 r"client/: holds C\+\+ sources but is no component", "a folder in no component")
    # The picture drawn in the doc no longer the graph's (kube may now use store).
    ok &= expect(run(edit_line(text, "kube", 3, "core store")), 1,
                 r"the ```picture block is not the graph's picture", "a picture that drifted")
    ok &= expect(run(text.replace("```picture", "```text")), 1, r"no ```picture block",
                 "a doc without the picture")
    # A malformed graph.
    ok &= expect(run(text.replace("store     | store/ | granary_store | core",
                                  "store     | store/ | granary_store | core nosuch")),
                 2, r"store may use 'nosuch', which is not a component", "an unknown component")
    ok &= expect(run("# no block here\n"), 2, r"has no ```layering block", "a doc without the block")
    ok &= expect(run(edit_line(text, "core", 3, "cli")), 2, r"a cycle through", "a cycle")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
