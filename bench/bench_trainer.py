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

- ``mds`` (the mosaic_streaming peer): Mosaic Streaming's ``StreamingDataset``
  over MDS shards at ``remote`` (on the slow mount), copied into the local
  cache directory ``local`` as it reads them (its epoch 0; later epochs read
  the cache), shuffled by the library (seed S), through a ``DataLoader`` with
  ``workers`` worker processes;
- ``wds`` (the webdataset peer): ``webdataset.WebDataset`` over tar shards in
  ``remote`` (on the slow mount), streamed from there every epoch (shards
  shuffled, then a 1,000-sample shuffle buffer, seed S + epoch), through a
  ``WebLoader`` with ``workers`` worker processes; ``opener`` "cat" (the
  default) streams each shard through ``pipe:cat PATH``, "path" lets
  WebDataset open the path itself (reads of a few KiB).
- ``litdata`` (the litdata peer): LitData's ``StreamingDataset`` over the
  chunks ``litdata.optimize`` wrote to ``remote`` (on the slow mount), named
  ``local:REMOTE`` so that it copies them into the local cache directory
  ``local`` as it reads them (its epoch 0; later epochs read the cache),
  shuffled by the library (seed S), through its ``StreamingDataLoader`` with
  ``workers`` worker processes.
The peers deliver in their own order, not the plan's: each record carries its
sample id (the index's position of the file it was made from), and the same
per-epoch exactly-once and CRC-32 checks apply.

A spec may ask for a ``copy`` first (copy_then_train): ``threads`` threads copy
every file of ``copy["from"]`` (found by walking it, as cp -r does) to
``copy["to"]``, timed as setup; the epochs then read the copy. A peer's spec
asks for a ``convert`` instead ({"format": "mds", "wds" or "litdata", "from",
"to", "shard_bytes"}): ``threads`` threads read every file of ``from`` (walked
as the copy walks it) and the peer's own writer (``streaming.MDSWriter``,
``webdataset.ShardWriter``) packs them, with their ids, into shards of about
``shard_bytes`` in ``to``, timed as setup. LitData's writer is
``litdata.optimize``, which runs its own worker processes (``workers``, at
least 1): each reads its groups of files with ``threads / workers`` threads,
so as many reads are in flight as for the other conversions.

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
"threads"?, "dataset"?, "socket"?, "copy"?, "convert"?, "remote"?, "local"?,
"workers"?, "slowfs_stats"?, "paired"?}. RESULT: per
epoch seconds, samples/s, time to first batch, stall p50/p99, slow-source counters;
setup, exactly_once and the first violations, CPU seconds, peak RSS; with
"paired", the paired passes' seconds ({"epoch", "open", "view_seconds",
"local_seconds"}).
"""

import collections
import concurrent.futures
import json
import multiprocessing
import os
import resource
import shlex
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


def scrape_counters(probes):
    """The samples of the metrics named in probes (a list of {"url": a /metrics
    URL, "prefixes": [metric name prefixes]}): {"name{labels}": value}. A
    daemon that does not answer adds nothing."""
    import urllib.request
    out = {}
    for probe in probes or ():
        try:
            with urllib.request.urlopen(probe["url"], timeout=2.0) as r:  # noqa: S310
                text = r.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("#") or not line.startswith(tuple(probe["prefixes"])):
                continue
            name, _, value = line.rpartition(" ")
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
    return out


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

    def prepare(self, order, epoch):
        """The benchmark's own check that the sampler's order is the plan's, before
        the epoch's clock starts: no trainer does this."""
        self.sampler.set_epoch(epoch)
        if self.sampler.indices() != order:
            raise RuntimeError(f"epoch {epoch}: DistributedSampler's order differs from the plan's")

    def batches(self, order, batch, epoch):
        self.sampler.set_epoch(epoch)
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


def collate_list(samples):
    """A DataLoader batch as the list of its samples (no tensors)."""
    return samples


class MdsReader:
    """Mosaic Streaming: StreamingDataset over MDS shards on the source, a local cache
    (bounded by ``cache_limit`` bytes when given: the library evicts the least recently
    used shards past it)."""

    def __init__(self, remote, local, seed, workers, batch, cache_limit=None,
                 shuffle_block_size=None):
        import torch.utils.data
        from streaming import StreamingDataset
        from streaming.base import stream as streaming_stream
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
        # Bytes the library writes into its cache directory: every shard it
        # fetches goes through Stream.prepare_shard, which returns the bytes it
        # added to the cache (what its cache_limit accounting counts). Counted
        # in shared memory, so the forked DataLoader workers (which fetch)
        # add to the same counter.
        self.written = multiprocessing.Value("q", 0)
        written = self.written
        prepare = streaming_stream.Stream.prepare_shard
        if not getattr(prepare, "_bench_counted", False):
            def counted_prepare_shard(stream, shard):
                delta = prepare(stream, shard)
                with written.get_lock():
                    written.value += int(delta)
                return delta
            counted_prepare_shard._bench_counted = True
            streaming_stream.Stream.prepare_shard = counted_prepare_shard
        # shuffle_seed fixed: the library reshuffles every epoch by itself.
        self.ds = StreamingDataset(remote=remote, local=local, shuffle=True, shuffle_seed=seed,
                                   batch_size=batch, cache_limit=cache_limit,
                                   shuffle_block_size=shuffle_block_size)
        self.loader = torch.utils.data.DataLoader(self.ds, batch_size=batch, num_workers=workers,
                                                  collate_fn=collate_list)

    def written_bytes(self):
        return self.written.value

    def batches(self, order, batch, epoch):
        del order, batch, epoch  # the library's own order; each iteration is its next epoch
        for samples in self.loader:
            yield [int(s["id"]) for s in samples], [s["data"] for s in samples]

    def release(self, samples):
        pass

    def close(self):
        pass


class WdsReader:
    """WebDataset: tar shards on the source, streamed from there every epoch."""

    def __init__(self, remote, seed, workers, opener):
        # opener "cat": each shard through `pipe:cat PATH` (WebDataset's idiom for
        # streaming through a command; cat reads 128 KiB at a time); "path": the
        # path itself, which WebDataset opens with Python's default buffering
        # (reads of a few KiB, each one a source operation on a source without
        # kernel readahead, as granary-slowfs is).
        paths = sorted(os.path.join(remote, f) for f in os.listdir(remote) if f.endswith(".tar"))
        self.urls = [f"pipe:cat {shlex.quote(p)}" for p in paths] if opener == "cat" else paths
        self.seed = seed
        self.workers = workers

    def batches(self, order, batch, epoch):
        import webdataset as wds
        del order  # the library's own order
        ds = (wds.WebDataset(self.urls, shardshuffle=len(self.urls), seed=self.seed + epoch,
                             nodesplitter=None, empty_check=False)
              .shuffle(1000).batched(batch, collation_fn=None, partial=True))
        for samples in wds.WebLoader(ds, batch_size=None, num_workers=self.workers):
            yield [int(s["__key__"]) for s in samples], [s["bin"] for s in samples]

    def release(self, samples):
        pass

    def close(self):
        pass


def litdata_item(item):
    """LitData's item as the trainer checks it: LitData hands `bytes` columns
    back as memoryviews of its chunk, which its worker processes cannot pickle
    (a StreamingDataset transform; module level, so spawned workers import it)."""
    return {"id": int(item["id"]), "data": bytes(item["data"])}


class LitDataReader:
    """LitData: StreamingDataset over optimize()'s chunks on the source, a local cache."""

    def __init__(self, remote, local, seed, workers, batch):
        from litdata import StreamingDataLoader, StreamingDataset
        # "local:" makes LitData treat the directory as remote storage: chunks
        # are copied into cache_dir as they are read, as Mosaic Streaming does.
        # Given the plain path, LitData memory-maps the chunk files on the
        # source, which granary-slowfs (direct_io) refuses with ENODEV.
        self.ds = StreamingDataset(f"local:{remote}", cache_dir=local, shuffle=True, seed=seed,
                                   transform=litdata_item)
        self.loader = StreamingDataLoader(self.ds, batch_size=batch, num_workers=workers,
                                          collate_fn=collate_list)

    def batches(self, order, batch, epoch):
        del order, batch, epoch  # the library's own order; each iteration is its next epoch
        for samples in self.loader:
            yield [s["id"] for s in samples], [s["data"] for s in samples]

    def release(self, samples):
        pass

    def close(self):
        pass


def litdata_read_group(group, src, threads):
    """optimize()'s fn: the files of one group (sample id, path), read by
    `threads` threads, yielded as LitData items in the group's order."""
    with concurrent.futures.ThreadPoolExecutor(max(1, threads), "converter") as pool:
        datas = pool.map(lambda item: read_file(os.path.join(src, item[1])), group)
        for (i, _), data in zip(group, datas):
            yield {"id": i, "data": data}


def convert_litdata(spec, threads, workers, index, violation):
    """The litdata conversion: litdata.optimize over groups of the walked files."""
    import functools

    import litdata
    src, dst = spec["from"], spec["to"]
    ids = {p: i for i, p in enumerate(index["paths"])}
    files = source_files(src, {os.path.basename(dst)})
    known = []
    for path in files:
        if path not in ids:
            violation(f"the conversion found {path}, which the tree does not have")
        else:
            known.append((ids[path], path))
    workers = max(1, workers)
    groups = [known[k:k + 64] for k in range(0, len(known), 64)]
    # optimize() switches the process to the spawn start method (its default,
    # force=True). Training normally runs in another process than the
    # conversion, with the platform's default (fork): that is put back, so
    # the StreamingDataLoader's workers start as they would there.
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(fn=functools.partial(litdata_read_group, src=src,
                                              threads=max(1, threads // workers)),
                         inputs=groups, output_dir=dst, chunk_bytes=int(spec["shard_bytes"]),
                         num_workers=workers, verbose=False)
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    # What optimize() wrote, from its index.json: items and bytes of the chunks
    # (the samples and LitData's item headers; each sample's bytes are checked
    # when the epochs read them).
    with open(os.path.join(dst, "index.json")) as f:
        chunks = json.load(f)["chunks"]
    return sum(c["chunk_size"] for c in chunks), sum(c["chunk_bytes"] for c in chunks)


def source_files(src, skip):
    """The files under src, walked as cp -r does, relative to it (not the slowfs
    stats file, nor the top-level entries named in skip)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        rel = os.path.relpath(dirpath, src)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in skip]
        for name in sorted(filenames):
            if name.startswith(".slowfs-stats") or (rel == "." and name in skip):
                continue
            files.append(os.path.normpath(os.path.join(rel, name)))
    return files


def convert_tree(spec, threads, index, violation):
    """A peer's one-time conversion: every file of spec["from"] read by `threads`
    threads (in walk order, bounded read-ahead) and written, with its sample id,
    into shards in spec["to"] by the peer's own writer. Returns (files, bytes)."""
    src, dst, fmt = spec["from"], spec["to"], spec["format"]
    ids = {p: i for i, p in enumerate(index["paths"])}
    files = source_files(src, {os.path.basename(dst)})
    os.makedirs(dst, exist_ok=True)
    if fmt == "mds":
        from streaming import MDSWriter
        writer = MDSWriter(out=dst, columns={"id": "int", "data": "bytes"},
                           size_limit=int(spec["shard_bytes"]))

        def write(i, data):
            writer.write({"id": i, "data": data})
    elif fmt == "wds":
        import webdataset as wds
        writer = wds.ShardWriter(os.path.join(dst, "shard-%06d.tar"),
                                 maxsize=int(spec["shard_bytes"]), maxcount=1 << 30, verbose=0)

        def write(i, data):
            writer.write({"__key__": f"{i:07d}", "bin": data})
    else:
        raise ValueError(f"unknown conversion format {fmt!r}")
    nbytes = 0
    depth = max(1, 4 * threads)
    with writer, concurrent.futures.ThreadPoolExecutor(max(1, threads), "converter") as pool:
        pending = collections.deque()
        position = 0
        for _ in files:
            while position < len(files) and len(pending) < depth:
                path = files[position]
                pending.append((path, pool.submit(read_file, os.path.join(src, path))))
                position += 1
            path, future = pending.popleft()
            data = future.result()
            if path not in ids:
                violation(f"the conversion found {path}, which the tree does not have")
                continue
            write(ids[path], data)
            nbytes += len(data)
    return len(files), nbytes


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
        probes_before = scrape_counters(probes)
        written_before = reader.written_bytes() if hasattr(reader, "written_bytes") else None
        before = slowfs_counts(stats_path)
        if hasattr(reader, "prepare"):
            reader.prepare(order, epoch)  # checks outside the timed epoch
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
        extra = {}
        if probes:
            after = scrape_counters(probes)
            extra["counters"] = {k: v - probes_before.get(k, 0.0) for k, v in after.items()}
        if written_before is not None:
            extra["cache_written_bytes"] = reader.written_bytes() - written_before
        return dict(extra, **{
            "epoch": epoch, "seconds": seconds, "samples_per_s": count / seconds,
            "source_opens": source["opens"], "source_stats": source["stats"],
            "source_reads": source["reads"], "source_bytes": source["read_bytes"],
            "source_readdirs": source["readdirs"],
            "stall_p50_ms": percentile(stalls, 50) * 1000,
            "stall_p99_ms": percentile(stalls, 99) * 1000,
            "first_batch_s": first_batch or 0.0, "check_seconds": check_seconds,
        })

    probes = spec.get("metrics")
    workers = int(spec.get("workers", 0))
    if spec.get("convert"):
        before = slowfs_counts(stats_path)
        t0 = time.perf_counter()
        if spec["convert"]["format"] == "litdata":
            converted, nbytes = convert_litdata(spec["convert"], int(spec.get("threads", 1)),
                                                workers, index, violation)
            expected_bytes = nbytes  # chunk bytes, not the samples': only the count compares
        else:
            converted, nbytes = convert_tree(spec["convert"], int(spec.get("threads", 1)), index,
                                             violation)
            expected_bytes = index["bytes"]
        result["setup_seconds"] = time.perf_counter() - t0
        result["setup_source"] = counts_delta(before, slowfs_counts(stats_path))
        if converted != n or nbytes != expected_bytes:
            violation(f"the conversion wrote {converted} samples, {nbytes} bytes; the tree has "
                      f"{n} files, {index['bytes']} bytes")
        print(f"    conversion ({spec['convert']['format']}): {converted} files, "
              f"{nbytes / 1e6:.1f} MB in {result['setup_seconds']:.2f} s", flush=True)

    if spec["reader"] == "granary":
        reader = GranaryReader(spec["dataset"], spec["socket"], seed, index)
    elif spec["reader"] == "mds":
        reader = MdsReader(spec["remote"], spec["local"], seed, workers, batch,
                           spec.get("cache_limit"), spec.get("shuffle_block_size"))
    elif spec["reader"] == "litdata":
        reader = LitDataReader(spec["remote"], spec["local"], seed, workers, batch)
    elif spec["reader"] == "wds":
        reader = WdsReader(spec["remote"], seed, workers, spec.get("opener", "cat"))
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
