"""granary.Dataset's direct reads against a real sidecar whose cache node hands
it chunk files: ds[i] and __getitems__ read staged samples from the chunk
files (counted by the session), every byte equal to the source's; in a forked
child and in spawned DataLoader workers too; and nothing is read directly
with direct_reads=False or $GRANARY_DIRECT_READS=0."""

import argparse
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
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
