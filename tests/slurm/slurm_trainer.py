"""The trainer a Slurm job of tests/slurm/slurm_cluster_test.cc runs: one
epoch over $GRANARY_DATASET through granary.torch's DistributedSampler and a
torch DataLoader, from the sidecar at $GRANARY_SOCKET, checking every
sample's SHA-256 against that of the same file under --golden (the source,
or a copy the cache has never seen); then, with --mount, a few files by path
under the dataset's POSIX view ($DW_JOB_STRIPED/<name>): same bytes, owned by
the job's user, read-only. Prints "trainer OK ..." and exits 0, or names the
first problem and exits 1."""

import argparse
import errno
import hashlib
import os
import sys

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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--golden", required=True, help="a tree with the source's files")
    p.add_argument("--mount", help="the dataset's view: read a few files by path there")
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
    loader = torch.utils.data.DataLoader(Indexed(ds), sampler=sampler, batch_size=None,
                                         num_workers=0, collate_fn=lambda x: x)
    seen = set()
    for index, data in loader:
        path = paths[index]
        if hashlib.sha256(bytes(data)).hexdigest() != expected[path]:
            fail(f"sample {index} ({path}): checksum differs from the source's")
        seen.add(index)
    if len(seen) != len(paths):
        fail(f"one epoch read {len(seen)} distinct samples of {len(paths)}")

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
    print(f"trainer OK: {len(seen)} samples checked through the sidecar, {by_path} files by path",
          flush=True)


if __name__ == "__main__":
    main()
