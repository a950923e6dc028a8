"""The training process of the Slurm and Kubernetes tests
(tests/integration/slurm_cluster_test.cc, tests/integration/kubernetes/mixed_site_test.cc,
tests/integration/kubernetes/training_pod_test.cc): reads $GRANARY_DATASET through
granary.torch's DistributedSampler and a torch DataLoader from the sidecar at
$GRANARY_SOCKET, for --epochs epochs, checking every sample's SHA-256 against
that of the same file under --golden (the source, or a copy the cache has
never seen). Options:
  --compare-local  after each epoch, the same order read from the files under
                   --golden (the page cache warm), and both rates printed;
  --metrics-port   the sidecar's /metrics on 127.0.0.1: print its fetch and
                   chunk-handoff counters, and fail unless the handoff served;
  --mount          a few files by path under the dataset's POSIX view
                   ($DW_JOB_STRIPED/<name>): same bytes, owned by the job's
                   user, read-only.
Prints "trainer OK: <n> samples ..." and exits 0, or names the first problem
and exits 1."""

import argparse
import errno
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
        path = paths[index]
        if hashlib.sha256(bytes(data)).hexdigest() != expected[path]:
            fail(f"sample {index} ({path}): checksum differs from the source's")
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
        if line.startswith("granary_sidecar_"):
            name, _, value = line.rpartition(" ")
            counters[name] = float(value)
    return counters


def check_sidecar_counters(port):
    # The sidecar copies its fetcher's counts into /metrics periodically: wait
    # (at most 10 s) until they have caught up with what was read.
    deadline = time.monotonic() + 10
    while True:
        counters = sidecar_counters(port)
        fetched = sum(v for k, v in counters.items()
                      if k.startswith("granary_sidecar_fetched_samples_total"))
        if fetched > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for key in sorted(counters):
        if "local_file" in key or "fetched_samples_total" in key:
            print(f"sidecar {key} {counters[key]:.0f}", flush=True)
    if counters.get("granary_sidecar_local_file_pieces_total", 0) <= 0:
        fail("the sidecar read nothing through the cache node's chunk handoff "
             "(granary_sidecar_local_file_pieces_total is 0)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--golden", required=True, help="a tree with the source's files")
    p.add_argument("--mount", help="the dataset's view: read a few files by path there")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--compare-local", action="store_true")
    p.add_argument("--metrics-port", type=int, help="the sidecar's /metrics port")
    a = p.parse_args()

    expected = {}
    for top, _, files in os.walk(a.golden):
        for f in files:
            full = os.path.join(top, f)
            with open(full, "rb") as data:
                expected[os.path.relpath(full, a.golden)] = hashlib.sha256(data.read()).hexdigest()
    name = os.environ.get("GRANARY_DATASET")
    if not name or not os.environ.get("GRANARY_SOCKET"):
        fail(f"GRANARY_DATASET={name!r} GRANARY_SOCKET={os.environ.get('GRANARY_SOCKET')!r}")
    ds = granary.Dataset(name)
    paths = ds.paths()
    if sorted(paths) != sorted(expected):
        fail(f"dataset {name} has {len(paths)} files, {a.golden} {len(expected)}")

    sampler = gt.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=1)
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        granary_s = epoch_through_granary(ds, sampler, paths, expected)
        if a.compare_local:
            local_s = epoch_from_local_files(a.golden, list(iter(sampler)), paths, expected)
            print(f"epoch {epoch}: granary {len(paths) / granary_s:.0f} samples/s, "
                  f"local files {len(paths) / local_s:.0f} samples/s, "
                  f"ratio {local_s / granary_s:.2f}", flush=True)
    if a.metrics_port:
        check_sidecar_counters(a.metrics_port)

    by_path = 0
    if a.mount:
        for path in sorted(expected)[:: max(1, len(expected) // 7)]:
            full = os.path.join(a.mount, path)
            with open(full, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != expected[path]:
                    fail(f"{full}: bytes differ from the source's")
            st = os.stat(full)
            if st.st_uid != os.getuid():
                fail(f"{full} is owned by uid {st.st_uid}, not the job's {os.getuid()}")
            by_path += 1
        try:
            with open(os.path.join(a.mount, "new-file"), "wb"):
                pass
            fail(f"{a.mount} is writable")
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                fail(f"writing under {a.mount}: {e}")
    print(f"trainer OK: {len(paths)} samples checked through the sidecar in each of {a.epochs} "
          f"epochs, {by_path} files by path", flush=True)


if __name__ == "__main__":
    main()
