"""Files of a mounted dataset (the sidecar's `mounts:`) read by path: every
file under --view equals the one under --source-root, read with
granary.read_file (unbuffered: no isatty() ioctl per file) or, with
--buffered, with Python's default open(). The C++ test compares the view's
ioctl counter around each run."""

import argparse
import os

import granary
from granary_test_util import check


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--view", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--buffered", action="store_true")
    a = p.parse_args()
    files = 0
    for root, dirs, names in os.walk(a.view):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, a.view)
            if a.buffered:
                with open(path, "rb") as f:
                    data = f.read()
            else:
                data = granary.read_file(path)
            with open(os.path.join(a.source_root, rel), "rb") as f:
                check(data == f.read(), f"{rel}: the view's bytes differ from the source's")
            files += 1
    check(files > 0, f"no file under {a.view}")
    print(f"{files} files read, {'buffered' if a.buffered else 'granary.read_file'}")


if __name__ == "__main__":
    main()
