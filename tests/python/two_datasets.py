"""Two datasets read side by side (two sessions on one sidecar) never return
each other's bytes, copied or zero-copy."""

import argparse

import granary
from granary_test_util import check, read_source


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True)
    p.add_argument("--root-a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--root-b", required=True)
    a = p.parse_args()

    da, db = granary.Dataset(a.a), granary.Dataset(a.b)
    za, zb = granary.Dataset(a.a, zero_copy=True), granary.Dataset(a.b, zero_copy=True)
    sa = read_source(a.root_a, da.paths())
    sb = read_source(a.root_b, db.paths())
    check(set(sa).isdisjoint(sb), "the two sources share files")
    check(da.session.manifest_id != db.session.manifest_id, "same manifest id")
    n = min(len(da), len(db))
    for i in range(n):
        check(da[i] == sa[i], f"{a.a}[{i}] is not its source")
        check(db[i] == sb[i], f"{a.b}[{i}] is not its source")
        x, y = za[i], zb[i]
        check(bytes(x) == sa[i] and bytes(y) == sb[i], f"zero-copy [{i}] mixed up")
        x.release()
        y.release()
    batch_a = da.__getitems__(list(range(n - 1, -1, -1)))
    batch_b = db.__getitems__(list(range(n)))
    check(batch_a == sa[:n][::-1], f"{a.a} batch")
    check(batch_b == sb[:n], f"{a.b} batch")
    print(f"{n} samples of each dataset, interleaved: never mixed")


if __name__ == "__main__":
    main()
