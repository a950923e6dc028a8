"""Helpers shared by the Python client's integration scripts (tests/python/).

Each script is run by tests/integration/python_client_test.cc against a real
granary-sidecar, real cache nodes and Redis, with PYTHONPATH holding the built
package and GRANARY_SOCKET the sidecar's socket. A script exits 0 when every
check held; on the first failed check it prints what differed and exits 1.
"""

import json
import os
import sys
import time


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def expect_raises(exception, function, *args, contains=None):
    """Calls function(*args); fails unless it raises `exception` (mentioning `contains`)."""
    try:
        function(*args)
    except exception as e:  # noqa: B902
        if contains is not None and contains not in str(e):
            fail(f"{function.__name__}{args}: {type(e).__name__} {e!s} does not mention "
                 f"{contains!r}")
        return e
    except Exception as e:  # noqa: BLE001
        fail(f"{function.__name__}{args}: raised {type(e).__name__} {e!s}, expected "
             f"{exception.__name__}")
    fail(f"{function.__name__}{args}: raised nothing, expected {exception.__name__}")
    return None


def read_source(root, paths):
    """The bytes of each path under the source root, in order."""
    out = []
    for path in paths:
        with open(os.path.join(root, path), "rb") as f:
            out.append(f.read())
    return out


def id_of_bytes(source):
    """bytes -> id; the test datasets' files are distinct random bytes."""
    index = {data: i for i, data in enumerate(source)}
    check(len(index) == len(source), "the source files are not all distinct")
    return index


def wait_for_file(path, timeout):
    """Polls for `path` until `timeout` seconds pass; whether it appeared."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.02)
    return os.path.exists(path)


def touch(path, contents=""):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(contents)
    os.replace(tmp, path)


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def collate_list(batch):
    """A DataLoader collate_fn keeping a batch of bytes as a list (picklable for spawn)."""
    return list(batch)


def torchvision_image_folder(source_root):
    """What torchvision's DatasetFolder finds in the tree at `source_root`:
    (classes, class_to_idx, [(path relative to the root, class index)]).
    Classes are the top-level directories, sorted (empty ones too); samples
    are every file under them."""
    classes = sorted(e.name for e in os.scandir(source_root) if e.is_dir())
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples = []
    for c in classes:
        for root, _, files in sorted(os.walk(os.path.join(source_root, c))):
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(root, f), source_root)
                samples.append((rel, class_to_idx[c]))
    return classes, class_to_idx, samples
