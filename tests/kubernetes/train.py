"""The training container of tests/kubernetes/training_pod_test.cc: a pod
labelled granary.io/dataset gets Granary's sidecar from the webhook, and
this script, with no Granary configuration of its own, reads its dataset
through granary.torch from $GRANARY_SOCKET and $GRANARY_DATASET, which the
webhook put in its environment.

It reads two epochs (DistributedSampler order, a DataLoader without workers)
and checks every sample's SHA-256 against the file of the same path under
--golden (the source, mounted read-only), then the same epoch order from the
local files under --golden (the page cache warm), and prints the rates. With
--metrics-port, it reads the sidecar's /metrics and prints its fetch and
chunk-handoff counters. Prints "trainer OK ..." and exits 0, or names the
first problem and exits 1."""

import argparse
import hashlib
import os
import sys
import time
import urllib.request

import torch

import granary
import granary.torch as gt


def fail(message):
    print(f"trainer FAILED: {message}", flush=True)
    sys.exit(1)


class Indexed(torch.utils.data.Dataset):
    """(index, bytes) items, so the loop knows which sample it checks."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, index):
        return index, bytes(self.ds[index])


def epoch_through_granary(ds, sampler, paths, expected):
    loader = torch.utils.data.DataLoader(Indexed(ds), sampler=sampler, batch_size=None,
                                         num_workers=0, collate_fn=lambda x: x)
    seen = set()
    start = time.monotonic()
    for index, data in loader:
        if hashlib.sha256(data).hexdigest() != expected[paths[index]]:
            fail(f"sample {index} ({paths[index]}): checksum differs from the source's")
        seen.add(index)
    seconds = time.monotonic() - start
    if len(seen) != len(paths):
        fail(f"one epoch read {len(seen)} distinct samples of {len(paths)}")
    return seconds


def epoch_from_local_files(golden, order, paths, expected):
    start = time.monotonic()
    for index in order:
        with open(os.path.join(golden, paths[index]), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != expected[paths[index]]:
                fail(f"local file {paths[index]} changed under the test")
    return time.monotonic() - start


def sidecar_counters(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    counters = {}
    for line in text.splitlines():
        if line.startswith("granary_sidecar_") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            counters[name] = float(value)
    return counters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--golden", required=True, help="a tree with the source's files")
    p.add_argument("--metrics-port", type=int, help="the sidecar's /metrics port")
    a = p.parse_args()

    name = os.environ.get("GRANARY_DATASET")
    if not name or not os.environ.get("GRANARY_SOCKET"):
        fail(f"GRANARY_DATASET={name!r} GRANARY_SOCKET={os.environ.get('GRANARY_SOCKET')!r}: "
             "the webhook did not set them")
    expected = {}
    for top, _, files in os.walk(a.golden):
        for f in files:
            full = os.path.join(top, f)
            with open(full, "rb") as data:
                expected[os.path.relpath(full, a.golden)] = hashlib.sha256(data.read()).hexdigest()

    ds = granary.Dataset(name)
    paths = ds.paths()
    if sorted(paths) != sorted(expected):
        fail(f"dataset {name} has {len(paths)} files, {a.golden} {len(expected)}")
    sampler = gt.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=7)
    rates = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = list(iter(sampler))
        granary_s = epoch_through_granary(ds, sampler, paths, expected)
        local_s = epoch_from_local_files(a.golden, order, paths, expected)
        rates.append((len(paths) / granary_s, len(paths) / local_s))
        print(f"epoch {epoch}: granary {len(paths) / granary_s:.0f} samples/s, "
              f"local files {len(paths) / local_s:.0f} samples/s, "
              f"ratio {local_s / granary_s:.2f}", flush=True)

    if a.metrics_port:
        counters = sidecar_counters(a.metrics_port)
        for key in sorted(counters):
            if "local_file" in key or "fetched_samples_total" in key:
                print(f"sidecar {key} {counters[key]:.0f}", flush=True)
        pieces = counters.get("granary_sidecar_local_file_pieces_total", 0)
        if pieces <= 0:
            fail("the sidecar read nothing through the cache node's chunk handoff "
                 "(granary_sidecar_local_file_pieces_total is 0)")
    print(f"trainer OK: {len(paths)} samples per epoch, 2 epochs", flush=True)


if __name__ == "__main__":
    main()
