"""An epoch that loses a cache node half-way still completes with the right bytes.

Reads one epoch with DataLoader(num_workers=2); after half of the batches it
creates --half-file and waits (bounded) for --go-file, which the test creates
after killing a cache node; then reads the rest and checks every sample
against its source file, in the sampler's order.
"""

import argparse

import torch.utils.data

import granary
from granary.torch import DistributedSampler
from granary_test_util import check, collate_list, read_source, touch, wait_for_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--half-file", required=True)
    p.add_argument("--go-file", required=True)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--timeout", type=float, default=60)
    a = p.parse_args()

    ds = granary.Dataset(a.dataset)
    source = read_source(a.source_root, ds.paths())
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=11)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, sampler=sampler,
                                         num_workers=2, collate_fn=collate_list)
    expected = sampler.indices()
    half = len(loader) // 2
    got = []
    for i, batch in enumerate(loader):
        got += batch
        if i + 1 == half:
            touch(a.half_file)
            check(wait_for_file(a.go_file, a.timeout),
                  f"the test did not create {a.go_file} within {a.timeout} s")
    check(len(got) == len(expected), f"read {len(got)} samples, expected {len(expected)}")
    wrong = [k for k in range(len(got)) if got[k] != source[expected[k]]]
    check(not wrong, f"{len(wrong)} samples differ from their source files, first at position "
          f"{wrong[0] if wrong else 0} (id {expected[wrong[0]] if wrong else 0})")
    print(f"epoch of {len(got)} samples complete and correct across the node kill "
          f"(half-way after {half} batches)")


if __name__ == "__main__":
    main()
