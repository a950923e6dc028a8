"""granary.Dataset's direct reads against a real sidecar whose cache node hands
it chunk files: ds[i] and __getitems__ read staged samples from the chunk
files (counted by the session), every byte equal to the source's; zero-copy
Samples over the chunk files' maps, checked on first use; a sample damaged on
disk (with --data-dir, the node's) is never returned, the arena's copy is, in
a copy and in a zero-copy batch; in a forked child and in spawned DataLoader
workers too; and nothing is read directly with direct_reads=False or
$GRANARY_DIRECT_READS=0."""

import argparse
import glob
import os
import random

import granary
from granary_test_util import check, read_source

try:
    import torch.utils.data
except ImportError:  # the venvs of the pyenv CPythons have the wheel and nothing else
    torch = None


class Probe:
    """A map-style dataset over granary.Dataset whose items say how many
    samples the worker's session read directly so far (picklable: spawn)."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        data = self.inner[i]
        return i, data, self.inner.session.direct_counters()["samples"]


def as_list(batch):
    return batch


def damage(data_dir, sample):
    """Flips the first 16 bytes of `sample` where the node's chunk files hold it."""
    for path in glob.glob(os.path.join(data_dir, "**", "*.chunk"), recursive=True):
        with open(path, "r+b") as f:
            at = f.read().find(sample)
            if at < 0:
                continue
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in sample[:16]))
            return
    raise AssertionError(f"no chunk file under {data_dir} holds the sample")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--data-dir", help="the cache node's data directory (to damage a sample)")
    a = p.parse_args()

    ds = granary.Dataset(a.dataset)
    n = len(ds)
    source = read_source(a.source_root, ds.paths())
    order = list(range(n))
    random.Random(7).shuffle(order)
    for i in order:
        check(ds[i] == source[i], f"ds[{i}]")
    c = ds.session.direct_counters()
    check(c["samples"] == n and c["fallbacks"] == 0 and c["chunk_files"] > 0,
          f"every ds[i] read from its chunk file: {c}")

    # Batches: one CHUNK_FILES for the chunks not known yet, then preads.
    batched = granary.Dataset(a.dataset)
    for start in range(0, n, 37):
        ids = order[start:start + 37]
        got = batched.__getitems__(ids)
        check(got == [source[i] for i in ids], f"__getitems__ from {start}")
    c = batched.session.direct_counters()
    check(c["samples"] == n, f"every batched sample read from its chunk file: {c}")

    # Zero-copy: Samples over the chunk files' maps, one request per batch for
    # the chunks not known yet, each sample checked when first used.
    zc = granary.Dataset(a.dataset, zero_copy=True)
    for start in range(0, n, 37):
        ids = order[start:start + 37]
        got = zc.__getitems__(ids)
        check([bytes(memoryview(s)) for s in got] == [source[i] for i in ids],
              f"zero-copy __getitems__ from {start}")
        for s in got:
            s.release()
    c = zc.session.direct_counters()
    check(c["samples"] == n and c["fallbacks"] == 0,
          f"every zero-copy sample read from its chunk file's map: {c}")
    one = zc[order[0]]
    check(one == source[order[0]] and len(one) == len(source[order[0]]), "zc[i]")
    one.release()
    try:
        bytes(one)
        check(False, "a released mapped Sample's bytes")
    except ValueError:
        pass

    if a.data_dir:
        # Damaged on disk: the copy and the zero-copy batch get the right
        # bytes (the arena's: the sidecar's verified read has the node stage
        # it again), never the damaged ones.
        for zero_copy, victim in ((False, order[3]), (True, order[11])):
            damage(a.data_dir, source[victim])
            fresh = granary.Dataset(a.dataset, zero_copy=zero_copy)
            ids = order[:16]
            got = fresh.__getitems__(ids)
            got = [bytes(s) if zero_copy else s for s in got]
            check(got == [source[i] for i in ids], f"damaged sample {victim}, zero_copy={zero_copy}")
            c = fresh.session.direct_counters()
            check(c["corrupt"] == 1 and 0 < c["samples"] <= 15,
                  f"the damaged sample was detected, the rest read directly: {c}")

    # A forked child opens its own session and reads directly too.
    pid = os.fork()
    if pid == 0:
        ok = all(ds[i] == source[i] for i in order[:50])
        ok = ok and ds.session.direct_counters()["samples"] == 50
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "forked child's direct reads")

    # Spawned DataLoader workers (each opens its own session from the pickled
    # dataset) read every sample right, directly where they can.
    if torch is not None:
        loader = torch.utils.data.DataLoader(Probe(granary.Dataset(a.dataset)), batch_size=16,
                                             num_workers=2, multiprocessing_context="spawn",
                                             collate_fn=as_list)
        seen = 0
        direct_in_workers = 0
        for batch in loader:
            for i, data, direct in batch:
                check(data == source[i], f"spawned worker's sample {i}")
                direct_in_workers = max(direct_in_workers, direct)
                seen += 1
        check(seen == n, f"spawned workers delivered {seen} of {n}")
        check(direct_in_workers > 0, "spawned workers read no chunk file")

    # Off: through the arena only.
    off = granary.Dataset(a.dataset, direct_reads=False)
    check(off[3] == source[3] and off.__getitems__([1, 2]) == [source[1], source[2]], "off")
    check(off.session.direct_counters()["samples"] == 0, "direct_reads=False reads no chunk file")
    os.environ["GRANARY_DIRECT_READS"] = "0"
    env_off = granary.Dataset(a.dataset)
    check(env_off[4] == source[4], "env off")
    check(env_off.session.direct_counters()["samples"] == 0,
          "GRANARY_DIRECT_READS=0 reads no chunk file")
    print("direct_reads: ok")


if __name__ == "__main__":
    main()
