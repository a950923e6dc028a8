"""Holds zero-copy samples pinned, then waits to be killed (SIGKILL) by the test.

Writes --ready-file (JSON: pins held, bytes held) once the samples are pinned;
the test measures the sidecar's pin metrics, kills this process and checks
that they return to 0.
"""

import argparse
import time

import granary
from granary_test_util import check, write_json


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--ready-file", required=True)
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args()

    ds = granary.Dataset(a.dataset, zero_copy=True, lookahead=0)
    held = [ds[i] for i in range(a.count)]
    check(all(isinstance(s, granary.Sample) for s in held), "zero_copy items are not Samples")
    pinned = ds.session.pinned_count
    check(pinned == a.count, f"{pinned} pins held, expected {a.count}")
    ds.session.flush()  # no releases are pending: the sidecar's count is exact
    write_json(a.ready_file, {"pins": pinned, "bytes": sum(len(s) for s in held)})
    # Killed here by the test; exiting on its own is a failure.
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
    check(False, f"not killed within {a.timeout} s")
    print(held)  # keeps the samples alive until the end


if __name__ == "__main__":
    main()
