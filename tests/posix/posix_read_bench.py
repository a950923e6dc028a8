#!/usr/bin/python3
"""The POSIX view's read figures (docs/posix-view.md, "Figures").

    tests/posix/posix_read_bench.py [--files N] [--pairs P] [--build-dir build/release]
                                    [--cli BINARY]

Generates an ImageNet-like tree (bench/bench_dataset.py) on local disk, starts
one granary-cachenode and one granary-sidecar on an SQLite store, creates and
stages the dataset, then times plain-Python `os.walk` + `open().read()`
passes (every file, sorted walk order):
  local_warm      the source tree, already in the page cache
  mount_cold      through `granary mount`, the kernel's cache and the
                  sidecar's arena cold (bytes from the cache node), readahead on
  mount_noahead   the same, with --readahead off
  mount_nopin     the same, with hints but --pin-ahead 0
  mount_warm      a second pass over the same mount (the kernel's page cache)
  epoch0_manifest plans of a Granary sampler registered for epochs 0-4 (the
                  newest is epoch 4), then a cold pass in epoch 0's order
                  (open(..., buffering=0)) over a mount with --readahead
                  manifest: every first read is a jump, nothing is read ahead
  epoch0_auto     the same with --readahead auto: the mount starts on epoch
                  4 and switches to the epoch the reads follow
  *_raw           the same warm passes with open(..., buffering=0): no
                  isatty() per file, so no FUSE request at all over the mount
                  (Python's buffered open() asks isatty(), an ioctl the kernel
                  forwards to the view every time: one round trip per file)
Each mount pass is a fresh mount (a fresh kernel cache). The sidecar's arena
is smaller than the dataset, so a fresh pass finds little of it there.
Then, on the warm mount, P pairs of warm passes (local, then the mount,
seconds apart; buffered and raw), whose median ratios hold better on a
shared machine than one pass each, and the round trip of one ioctl
(`isatty()`, the only request a warm buffered pass sends) in a loop over
the mount and over the local file, in microseconds.
Prints one line per pass and the ratios; everything it starts it stops.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise RuntimeError("timed out: " + what)


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path and " fuse.granary " in line for line in f)


def read_pass(root, buffering=-1):
    files = 0
    nbytes = 0
    t0 = time.perf_counter()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            with open(os.path.join(dirpath, name), "rb", buffering=buffering) as f:
                nbytes += len(f.read())
            files += 1
    return files, nbytes, time.perf_counter() - t0


def ioctl_us(path, n=20000):
    """Microseconds per isatty() (the ioctl TCGETS) on one open file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.isatty(fd)
        return (time.perf_counter() - t0) / n * 1e6
    finally:
        os.close(fd)


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def order_pass(root, paths, order):
    """Reads paths[i] for i in order under root, unbuffered: (files, bytes, seconds)."""
    nbytes = 0
    t0 = time.perf_counter()
    for i in order:
        with open(os.path.join(root, paths[i]), "rb", buffering=0) as f:
            nbytes += len(f.read())
    return len(order), nbytes, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--pairs", type=int, default=5,
                    help="paired warm passes (local, mount) on the warm mount")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--cli", default=None, help="the granary binary (default: the build dir's)")
    args = ap.parse_args()
    build = os.path.abspath(args.build_dir)
    bins = {"cli": args.cli or f"{build}/cli/granary", "node": f"{build}/cachenode/granary-cachenode",
            "sidecar": f"{build}/sidecar/granary-sidecar"}
    work = args.work or tempfile.mkdtemp(prefix="granary-posix-bench-")
    procs = []
    env = dict(os.environ, GRANARY_LOG_LEVEL="warn")
    try:
        src = f"{work}/src"
        subprocess.run([sys.executable, f"{ROOT}/bench/bench_dataset.py", "--files",
                        str(args.files), src], check=True, stdout=subprocess.DEVNULL)
        store = f"sqlite://{work}/granary.db"
        port, node_metrics, side_metrics = free_port(), free_port(), free_port()
        # Cache nodes refuse to serve unauthenticated readers: the node, the
        # sidecar and the CLI share a cluster key, made in the work directory.
        key = f"{work}/cluster.key"
        subprocess.run([bins["cli"], "cluster-key", "generate", "--out", key, "--force"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(f"{work}/cachenode.yaml", "w") as f:
            f.write(f"node_id: bench-node\nlisten: 127.0.0.1:{port}\ndata_dir: {work}/cache\n"
                    f"capacity: 8GiB\nmetadata_store: {store}\n"
                    f"metrics_listen: 127.0.0.1:{node_metrics}\n"
                    f"local_socket: {work}/cachenode.sock\ncluster_key_file: {key}\n"
                    f"log_level: warn\n")
        procs.append(subprocess.Popen([bins["node"], "--config", f"{work}/cachenode.yaml"],
                                      env=env))
        sock = f"{work}/sidecar.sock"
        with open(f"{work}/sidecar.yaml", "w") as f:
            f.write(f"socket: {sock}\nmetadata_store: {store}\nlocal_node: bench-node\n"
                    f"local_node_socket: {work}/cachenode.sock\ncluster_key_file: {key}\n"
                    f"metrics_listen: 127.0.0.1:{side_metrics}\nlog_level: warn\n")
        procs.append(subprocess.Popen([bins["sidecar"], "--config", f"{work}/sidecar.yaml"],
                                      env=env))
        wait_for(lambda: os.path.exists(sock), 60, "the sidecar's socket")
        cli = [bins["cli"], "--store", store, "--cluster-key-file", key]
        subprocess.run(cli + ["dataset", "create", "bench", "--source", src, "--chunk-size",
                              "16MiB"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(cli + ["dataset", "wait", "bench", "--timeout", "10m"], check=True,
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        results = {}
        read_pass(src)  # into the page cache
        results["local_warm"] = read_pass(src)
        results["local_warm_raw"] = read_pass(src, 0)

        pairs = {"buffered": [], "raw": []}
        ioctl = {}

        def warm_pairs(mnt):
            # Local and mount passes back to back, so both see the same load.
            for _ in range(args.pairs):
                for mode, buffering in (("buffered", -1), ("raw", 0)):
                    local = read_pass(src, buffering)
                    view = read_pass(mnt, buffering)
                    pairs[mode].append(local[2] / view[2])
            first = sorted(os.listdir(src))[0]
            sample = os.path.join(first, sorted(os.listdir(os.path.join(src, first)))[0])
            ioctl["local"] = median([ioctl_us(os.path.join(src, sample)) for _ in range(3)])
            ioctl["mount"] = median([ioctl_us(os.path.join(mnt, sample)) for _ in range(3)])

        def mount_passes(name, extra, passes, after=None):
            mnt = f"{work}/mnt-{name}"
            os.makedirs(mnt, exist_ok=True)
            p = subprocess.Popen(cli + ["mount", "bench", mnt, "--socket", sock, "--foreground"]
                                 + extra, env=env, stdout=subprocess.DEVNULL)
            try:
                wait_for(lambda: mounted(mnt), 60, "the mount")
                for label in passes:
                    results[label] = read_pass(mnt, 0 if label.endswith("_raw") else -1)
                if after is not None:
                    after(mnt)
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)

        mount_passes("noahead", ["--readahead", "off"], ["mount_noahead"])
        mount_passes("nopin", ["--readahead", "manifest", "--pin-ahead", "0"], ["mount_nopin"])
        mount_passes("ahead", ["--readahead", "manifest"],
                     ["mount_cold", "mount_warm", "mount_warm_raw"],
                     warm_pairs if args.pairs > 0 else None)
        mount_passes("noahead2", ["--readahead", "off"], ["mount_noahead_2"])
        mount_passes("nopin2", ["--readahead", "manifest", "--pin-ahead", "0"],
                     ["mount_nopin_2"])
        mount_passes("ahead2", ["--readahead", "manifest"], ["mount_cold_2"])

        # A Granary sampler's plans, epochs 0-4 (registered by the sampler as
        # training code does), then epoch 0 read by plain files.
        sys.path.insert(0, os.path.join(build, "python"))
        import granary  # noqa: E402
        import granary.torch  # noqa: E402
        ds = granary.Dataset("bench", socket=sock)
        sampler = granary.torch.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True,
                                                   seed=42)
        for epoch in range(5):
            sampler.set_epoch(epoch)
            next(iter(sampler))
        paths = ds.paths()
        epoch0 = granary.rank_samples(len(paths), 42, 0, 1, 0, True, False)
        ds.close()
        for label, mode in (("epoch0_manifest", "manifest"), ("epoch0_auto", "auto")):
            mnt = f"{work}/mnt-{label}"
            os.makedirs(mnt, exist_ok=True)
            p = subprocess.Popen(cli + ["mount", "bench", mnt, "--socket", sock, "--foreground",
                                        "--readahead", mode], env=env, stdout=subprocess.DEVNULL)
            try:
                wait_for(lambda: mounted(mnt), 60, "the mount")
                results[label] = order_pass(mnt, paths, epoch0)
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)

        for label, (files, nbytes, seconds) in results.items():
            print(f"{label:16s} {files} files {nbytes / 2**20:8.1f} MiB {seconds:7.3f} s "
                  f"{files / seconds:9.0f} files/s {nbytes / 2**20 / seconds:8.1f} MiB/s")

        def speed(label):
            return results[label][0] / results[label][2]

        print(f"mount_warm / local_warm   {speed('mount_warm') / speed('local_warm'):.2f}")
        print(f"mount_warm_raw / local_warm_raw {speed('mount_warm_raw') / speed('local_warm_raw'):.2f}")
        for mode, ratios in pairs.items():
            if ratios:
                print(f"paired warm {mode:8s} mount / local: median {median(ratios):.2f} "
                      f"({', '.join(f'{r:.2f}' for r in ratios)})")
        if ioctl:
            print(f"isatty() round trip: mount {ioctl['mount']:.1f} us, "
                  f"local {ioctl['local']:.1f} us")
        print(f"mount_cold / local_warm   {speed('mount_cold') / speed('local_warm'):.2f}")
        ahead = (speed("mount_cold") + speed("mount_cold_2")) / 2
        noahead = (speed("mount_noahead") + speed("mount_noahead_2")) / 2
        print(f"readahead on / off (cold) {ahead / noahead:.2f}")
        nopin = (speed("mount_nopin") + speed("mount_nopin_2")) / 2
        print(f"pin-ahead on / off (cold) {ahead / nopin:.2f}")
        print(f"epoch 0, auto / manifest (cold) "
              f"{speed('epoch0_auto') / speed('epoch0_manifest'):.2f}")
        return 0
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
