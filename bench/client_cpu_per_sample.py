#!/usr/bin/python3
"""CPU per sample of the Python client's warm reads, against local files.

Where bench/client_bench.py times epochs (a fraction of a second each, so a
shared machine's noise swings them by 30% or more), this runs each read loop
for --seconds and reports samples/s, wall time and this process's CPU time
per sample (time.process_time()), which the other processes on the machine
disturb much less. It is also the loop to attach a profiler to: --hold S runs
the granary ds[i] loop S seconds more after printing this process's pid.

Same set-up as client_bench.py (one granary-cachenode with a handoff socket,
the dataset staged, one granary-sidecar with local_node_socket), then, over
one granary.torch.DistributedSampler order, warmed once:
  granary ds[i]            granary.Dataset(...)[i], a copy (direct read)
  local open().read()      the same files from the page cache
  zero-copy batch + crc32  __getitems__ of 32 with zero_copy=True, each
                           sample's zlib.crc32 (what bench/run-benchmark's
                           trainer does), then released
  local read + crc32       the local files, each read and crc32'd
  crc32 only               zlib.crc32 of bytes already in memory (the check's
                           own cost: the bound on the last two ratios)

    /usr/bin/python3 bench/client_cpu_per_sample.py [--files 5000] [--seconds 3]
        [--rounds 2] [--chunk-size 16MiB] [--hold S] [--build-dir build/release]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_bench as cb  # noqa: E402 (the set-up is client_bench's)


def start(build, files, chunk_size, work):
    procs = cb.Processes()
    source = os.path.join(work, "imagenet")
    os.makedirs(source)
    cb.generate(source, files, 42)
    store = f"sqlite://{work}/granary.db"
    port, node_metrics = cb.free_port(), cb.free_port()
    key = os.path.join(work, "cluster.key")
    cli = os.path.join(build, "cli", "granary")
    subprocess.run([cli, "cluster-key", "generate", "--out", key, "--force"], check=True,
                   capture_output=True)
    with open(os.path.join(work, "cachenode.yaml"), "w") as f:
        f.write(f"node_id: {cb.NODE_ID}\nlisten: 127.0.0.1:{port}\ndata_dir: {work}/cache\n"
                f"capacity: 8GiB\nmetadata_store: {store}\n"
                f"metrics_listen: 127.0.0.1:{node_metrics}\ncluster_key_file: {key}\n"
                f"local_socket: {work}/cachenode.sock\nheartbeat_interval: 500ms\n"
                f"heartbeat_ttl: 3s\nlog_level: warn\n")
    node = procs.start("granary-cachenode",
                       [os.path.join(build, "cachenode", "granary-cachenode"), "--config",
                        f"{work}/cachenode.yaml"], os.path.join(work, "cachenode.log"))
    cb.wait_ready(procs, node, node_metrics, "granary-cachenode")
    for argv in (["dataset", "create", cb.DATASET, "--source", source, "--chunk-size",
                  chunk_size], ["dataset", "wait", cb.DATASET, "--timeout", "10m"]):
        subprocess.run([cli, "--store", store, "--cluster-key-file", key] + argv, check=True,
                       capture_output=True)
    sock = os.path.join(work, "sidecar.sock")
    side_metrics = cb.free_port()
    with open(os.path.join(work, "sidecar.yaml"), "w") as f:
        f.write(f"socket: {sock}\nmetadata_store: {store}\nlocal_node: {cb.NODE_ID}\n"
                f"cluster_key_file: {key}\nlocal_node_socket: {work}/cachenode.sock\n"
                f"window_bytes: {64 << 20}\nmetrics_listen: 127.0.0.1:{side_metrics}\n"
                f"log_level: warn\n")
    side = procs.start("granary-sidecar",
                       [os.path.join(build, "sidecar", "granary-sidecar"), "--config",
                        f"{work}/sidecar.yaml"], os.path.join(work, "sidecar.log"))
    cb.wait_ready(procs, side, side_metrics, "granary-sidecar")
    return procs, sock, source


def timed(name, seconds, one_pass, samples):
    n = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    while time.perf_counter() - t0 < seconds:
        one_pass()
        n += samples
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    print(f"{name:<36} {n / wall:10,.0f} samples/s  wall {wall / n * 1e6:7.2f} us  "
          f"cpu {cpu / n * 1e6:7.2f} us/sample", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=cb.positive, default=5000)
    ap.add_argument("--seconds", type=float, default=3.0, help="per loop (default 3)")
    ap.add_argument("--rounds", type=cb.positive, default=2, help="of every loop (default 2)")
    ap.add_argument("--chunk-size", default="16MiB")
    ap.add_argument("--hold", type=float, default=0.0,
                    help="then the granary ds[i] loop this many seconds more, pid printed")
    ap.add_argument("--build-dir", default=os.path.join(cb.REPO, "build", "release"))
    args = ap.parse_args()
    build = os.path.abspath(args.build_dir)
    sys.path.insert(0, os.path.join(build, "python"))
    import granary
    import granary.torch

    work = tempfile.mkdtemp(prefix="granary-cpu-per-sample.")
    procs = None
    try:
        procs, sock, source = start(build, args.files, args.chunk_size, work)
        ds = granary.Dataset(cb.DATASET, socket=sock)
        zc = granary.Dataset(cb.DATASET, socket=sock, zero_copy=True)
        paths = [os.path.join(source, p) for p in ds.paths()]
        order = granary.torch.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True,
                                                 seed=0).indices()
        batches = [order[k:k + cb.BATCH] for k in range(0, len(order), cb.BATCH)]
        held = []
        for i in range(len(paths)):  # the page cache, and the check's input
            with open(paths[i], "rb") as f:
                held.append(f.read())
        for i in order:  # granary warm: every chunk file handed over once
            if ds[i] != held[i]:
                raise SystemExit(f"sample {i} differs from its local file")

        def local(i):
            with open(paths[i], "rb") as f:
                return f.read()

        def granary_items():
            for i in order:
                ds[i]

        def local_items():
            for i in order:
                local(i)

        def zero_copy_crc():
            for b in batches:
                samples = zc.__getitems__(b)
                for s in samples:
                    zlib.crc32(s)
                for s in samples:
                    s.release()

        def local_crc():
            for i in order:
                zlib.crc32(local(i))

        def crc_only():
            for i in order:
                zlib.crc32(held[i])

        for _ in range(args.rounds):
            timed("granary ds[i]", args.seconds, granary_items, len(order))
            timed("local open().read()", args.seconds, local_items, len(order))
            timed("granary zero-copy batch + crc32", args.seconds, zero_copy_crc, len(order))
            timed("local read + crc32", args.seconds, local_crc, len(order))
            timed("crc32 only (bytes in memory)", args.seconds, crc_only, len(order))
        print("direct reads (ds):", ds.session.direct_counters())
        print("direct reads (zero-copy):", zc.session.direct_counters())
        if args.hold > 0:
            print(f"pid {os.getpid()}", flush=True)
            timed("granary ds[i] (held)", args.hold, granary_items, len(order))
        return 0
    finally:
        if procs is not None:
            procs.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
