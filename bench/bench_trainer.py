"""The benchmark's trainer emulator (BENCHMARK.md, "Workload").

Reads every sample of an epoch in the plan's order (Granary's plan code,
``granary.rank_samples``: one rank, shuffled, seed S, ``set_epoch(e)``), in
batches of 32, either as fast as it can (``compute_ms`` 0) or spending a fixed
compute time per batch (a sleep: the GPU works while the CPU is free). Per
batch it records the stall: how long it waited for the batch's data. Every
delivered sample is checked against the dataset's index: its id must come
once per epoch, its bytes must have the index's size and CRC-32 (the check
is part of the trainer's per-batch work in both modes).

Readers (``reader`` in the spec):
- ``files``: files under ``root`` (the slow mount, a local copy, or the local
  tree), read with open()/read() by ``threads`` reader threads working ahead
  of the trainer by ``2 * threads`` batches, as a DataLoader with that many
  workers and prefetch_factor 2 would; ``threads`` 0 reads inline;
- ``granary``: ``granary.Dataset(name, socket=..., zero_copy=True)`` with
  ``granary.torch.DistributedSampler`` (which announces the plan to the
  sidecar), a batch per ``__getitems__``, each sample released after its check.

A spec may ask for a ``copy`` first (copy_then_train): ``threads`` threads copy
every file of ``copy["from"]`` (found by walking it, as cp -r does) to
``copy["to"]``, timed as setup; the epochs then read the copy.

A ``files`` spec may ask for ``paired`` passes ({"root", "opens"}; granary_posix
uses it): after every warm epoch the same order is read again from
``paired["root"]`` (the local tree) with the same open, and for "buffered" in
``opens`` from both trees with Python's default buffered open() (which asks
isatty() of every file, as torchvision's loaders do). The view and reference
passes of an epoch run seconds apart, so their ratio does not drift with the
machine the way contenders run minutes apart do.

Run by bench/run-benchmark, one process per contender:
    /usr/bin/python3 bench/bench_trainer.py SPEC.json RESULT.json
SPEC: {"reader", "index", "epochs", "seed", "batch", "compute_ms", "root"?,
"threads"?, "dataset"?, "socket"?, "copy"?, "slowfs_stats"?, "paired"?}. RESULT: per
epoch seconds, samples/s, time to first batch, stall p50/p99, slow-source counters;
setup, exactly_once and the first violations, CPU seconds, peak RSS; with
"paired", the paired passes' seconds ({"epoch", "open", "view_seconds",
"local_seconds"}).
"""

import collections
import concurrent.futures
import json
import os
import resource
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dataset  # noqa: E402
from granary import read_file  # noqa: E402  (unbuffered: no isatty() per file)

SOURCE_KEYS = ("opens", "stats", "readdirs", "reads", "read_bytes")


def slowfs_counts(path):
    """The slow source's counters now ({} when there is no slow source)."""
    if not path:
        return {}
    with open(path, "rb") as f:
        c = json.loads(f.read())
    return {k: c[k] for k in SOURCE_KEYS}


def counts_delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in SOURCE_KEYS}


def percentile(values, q):
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))
    return s[k]


def read_file_buffered(path):
    # Python's default open(), as torchvision's loaders use it: the buffered
    # reader asks isatty() of every file (an ioctl) before the first read.
    with open(path, "rb") as f:
        return f.read()


class FileReader:
    """Samples from files under a root, by reader threads working ahead of the trainer."""

    def __init__(self, root, paths, threads, batch, buffered=False):
        self.paths = [os.path.join(root, p) for p in paths]
        self.read = read_file_buffered if buffered else read_file
        self.threads = threads
        self.depth = max(1, 2 * threads) * batch
        self.pool = (concurrent.futures.ThreadPoolExecutor(threads, "reader")
                     if threads > 0 else None)

    def batches(self, order, batch, epoch):
        del epoch
        if self.pool is None:
            for start in range(0, len(order), batch):
                ids = order[start:start + batch]
                yield ids, [self.read(self.paths[i]) for i in ids]
            return
        pending = collections.deque()
        position = 0
        for start in range(0, len(order), batch):
            while position < len(order) and len(pending) < self.depth:
                pending.append(self.pool.submit(self.read, self.paths[order[position]]))
                position += 1
            ids = order[start:start + batch]
            yield ids, [pending.popleft().result() for _ in ids]

    def release(self, samples):
        pass

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class GranaryReader:
    """Samples through the sidecar: granary.Dataset + granary.torch.DistributedSampler."""

    def __init__(self, name, socket, seed, index):
        import granary
        import granary.torch
        self.ds = granary.Dataset(name, socket=socket, zero_copy=True)
        if len(self.ds) != index["files"]:
            raise RuntimeError(f"the sidecar reports {len(self.ds)} samples in {name!r}, the "
                               f"generated tree has {index['files']}")
        if self.ds.paths() != index["paths"]:
            raise RuntimeError(f"the snapshot of {name!r} lists other paths (or another order) "
                               f"than the generated tree")
        self.sampler = granary.torch.DistributedSampler(self.ds, num_replicas=1, rank=0,
                                                        shuffle=True, seed=seed)

    def batches(self, order, batch, epoch):
        self.sampler.set_epoch(epoch)
        if self.sampler.indices() != order:
            raise RuntimeError(f"epoch {epoch}: DistributedSampler's order differs from the plan's")
        it = iter(self.sampler)  # announces the plan: the sidecar prefetches this order
        while True:
            ids = [i for _, i in zip(range(batch), it)]
            if not ids:
                return
            yield ids, self.ds.__getitems__(ids)

    def release(self, samples):
        for s in samples:
            s.release()

    def close(self):
        self.ds.close()


def copy_tree(src, dst, threads):
    """Walks src (as cp -r does) and copies every file to dst with `threads` threads."""
    jobs = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        rel = os.path.relpath(dirpath, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for name in filenames:
            if name.startswith(".slowfs-stats"):
                continue
            jobs.append(os.path.join(rel, name))

    def copy_one(rel):
        data = read_file(os.path.join(src, rel))
        with open(os.path.join(dst, rel), "wb") as f:
            f.write(data)
        return len(data)

    with concurrent.futures.ThreadPoolExecutor(max(1, threads), "copier") as pool:
        return len(jobs), sum(pool.map(copy_one, jobs))


def vm_hwm_self():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run(spec):
    import granary  # the plan code (rank_samples), also for the non-Granary readers

    index = bench_dataset.load_index(spec["index"])
    n = index["files"]
    batch = int(spec.get("batch", 32))
    compute = float(spec.get("compute_ms", 0.0)) / 1000.0
    seed = int(spec["seed"])
    stats_path = spec.get("slowfs_stats")
    sizes, crcs = index["sizes"], index["crc32"]
    result = {"epochs": [], "setup_seconds": 0.0, "exactly_once": True, "violations": []}

    def violation(text):
        result["exactly_once"] = False
        if len(result["violations"]) < 20:
            result["violations"].append(text)

    t_start = time.perf_counter()
    root = spec.get("root")
    if spec.get("copy"):
        before = slowfs_counts(stats_path)
        t0 = time.perf_counter()
        copied, nbytes = copy_tree(spec["copy"]["from"], spec["copy"]["to"], spec["threads"])
        result["setup_seconds"] = time.perf_counter() - t0
        result["setup_source"] = counts_delta(before, slowfs_counts(stats_path))
        if copied != n or nbytes != index["bytes"]:
            violation(f"the copy found {copied} files, {nbytes} bytes; the tree has {n} files, "
                      f"{index['bytes']} bytes")
        print(f"    copy: {copied} files, {nbytes / 1e6:.1f} MB in {result['setup_seconds']:.2f} s",
              flush=True)
        root = spec["copy"]["to"]

    def run_epoch(reader, epoch, order, label=""):
        """One pass over `order` through `reader`: every sample checked, timed."""
        seen = bytearray(n)
        stalls = []
        check_seconds = 0.0
        first_batch = None
        before = slowfs_counts(stats_path)
        t0 = time.perf_counter()
        asked = t0
        count = 0
        for ids, samples in reader.batches(order, batch, epoch):
            got = time.perf_counter()
            stalls.append(got - asked)
            if first_batch is None:
                first_batch = got - t0
            for i, s in zip(ids, samples):
                if seen[i]:
                    violation(f"epoch {epoch}{label}: sample {i} ({index['paths'][i]}) "
                              f"delivered again")
                seen[i] = min(255, seen[i] + 1)
                if len(s) != sizes[i] or zlib.crc32(s) != crcs[i]:
                    violation(f"epoch {epoch}{label}: sample {i} ({index['paths'][i]}): "
                              f"{len(s)} bytes with CRC-32 {zlib.crc32(s):08x}, expected "
                              f"{sizes[i]} bytes with {crcs[i]:08x}")
            count += len(ids)
            reader.release(samples)
            check_seconds += time.perf_counter() - got
            if compute > 0:
                time.sleep(compute)
            asked = time.perf_counter()
        seconds = time.perf_counter() - t0
        source = counts_delta(before, slowfs_counts(stats_path))
        missing = n - sum(1 for v in seen if v)
        if missing:
            violation(f"epoch {epoch}{label}: {missing} samples never delivered")
        return {
            "epoch": epoch, "seconds": seconds, "samples_per_s": count / seconds,
            "source_opens": source["opens"], "source_stats": source["stats"],
            "source_reads": source["reads"], "source_bytes": source["read_bytes"],
            "source_readdirs": source["readdirs"],
            "stall_p50_ms": percentile(stalls, 50) * 1000,
            "stall_p99_ms": percentile(stalls, 99) * 1000,
            "first_batch_s": first_batch or 0.0, "check_seconds": check_seconds,
        }

    if spec["reader"] == "granary":
        reader = GranaryReader(spec["dataset"], spec["socket"], seed, index)
    else:
        reader = FileReader(root, index["paths"], int(spec.get("threads", 0)), batch)
    # "paired" (files readers): after every warm epoch (1, 2, ...), the same
    # order is read again from a reference tree (the local one) and, for each
    # open in "opens" other than "raw", from both trees with that open, in
    # alternating order, so each comparison is between passes seconds apart
    # rather than between contenders run minutes apart on a drifting machine.
    paired = spec.get("paired")
    pair_readers = {}
    if paired:
        threads = int(spec.get("threads", 0))
        for mode in paired["opens"]:
            buffered = mode == "buffered"
            pair_readers[mode] = (
                reader if not buffered else
                FileReader(root, index["paths"], threads, batch, buffered=True),
                FileReader(paired["root"], index["paths"], threads, batch, buffered=buffered))
        result["paired"] = []
    try:
        for epoch in range(int(spec["epochs"])):
            order = granary.rank_samples(n, seed, epoch, 1, 0, True, False)
            pairing = epoch > 0 and bool(pair_readers)
            local_passes = {}
            if pairing and epoch % 2 == 1:  # odd epochs: the reference passes first
                for mode, (_, local) in pair_readers.items():
                    local_passes[mode] = run_epoch(local, epoch, order, f" (local, {mode} open)")
            e = run_epoch(reader, epoch, order)
            result["epochs"].append(e)
            print(f"    epoch {epoch}: {e['seconds']:7.2f} s {e['samples_per_s']:9,.0f} samples/s "
                  f"first batch {1000 * e['first_batch_s']:7.1f} ms, stall p50 "
                  f"{e['stall_p50_ms']:.2f} ms p99 {e['stall_p99_ms']:.2f} ms; source: "
                  f"{e['source_opens']} opens, {e['source_stats']} stats, "
                  f"{e['source_reads']} reads, {e['source_bytes'] / 1e6:.1f} MB", flush=True)
            if not pairing:
                continue
            for mode, (view, local) in pair_readers.items():
                v = e if view is reader else run_epoch(view, epoch, order, f" (view, {mode} open)")
                if mode not in local_passes:
                    local_passes[mode] = run_epoch(local, epoch, order, f" (local, {mode} open)")
                lo = local_passes[mode]
                result["paired"].append({"epoch": epoch, "open": mode,
                                         "view_seconds": v["seconds"],
                                         "local_seconds": lo["seconds"]})
                print(f"    epoch {epoch} paired, {mode} open: view {n / v['seconds']:9,.0f} "
                      f"samples/s, local {n / lo['seconds']:9,.0f} samples/s "
                      f"(view/local {lo['seconds'] / v['seconds']:.3f})", flush=True)
    finally:
        reader.close()
        for view, local in pair_readers.values():
            local.close()
            if view is not reader:
                view.close()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_seconds"] = ru.ru_utime + ru.ru_stime
    result["peak_rss_bytes"] = vm_hwm_self()
    result["wall_seconds"] = time.perf_counter() - t_start
    return result


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench_trainer.py SPEC.json RESULT.json")
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    result = run(spec)
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
