"""The sidecar goes away in the middle of an epoch: the next read that needs it
fails with ConnectionError naming the socket and saying what to do, never
with wrong bytes; every sample read before is correct."""

import argparse

import granary
from granary_test_util import check, read_source, touch, wait_for_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--half-file", required=True)
    p.add_argument("--go-file", required=True)
    a = p.parse_args()
    ds = granary.Dataset(a.dataset, lookahead=0)
    source = read_source(a.source_root, ds.paths())
    half = len(ds) // 2
    for i in range(half):
        check(ds[i] == source[i], f"sample {i} before the sidecar went")
    touch(a.half_file)
    check(wait_for_file(a.go_file, 60), "the test never said go")
    error = None
    read = half
    try:
        for i in range(half, len(ds)):
            check(ds[i] == source[i], f"sample {i}: wrong bytes after the sidecar went")
            read += 1
    except ConnectionError as e:
        error = e
    check(error is not None, "every read succeeded without a sidecar")
    check(ds.session.socket_path in str(error), f"the error does not name the socket: {error}")
    check("granary-sidecar" in str(error) or "sidecar" in str(error),
          f"the error does not say the sidecar is the problem: {error}")
    print(f"sidecar gone after {read} samples: {type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
