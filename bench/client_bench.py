#!/usr/bin/python3
"""Python client benchmark: samples through granary-sidecar vs local files.

Generates an ImageNet-like tree in a temporary directory, stages it on one
granary-cachenode (embedded SQLite store), starts a granary-sidecar, and reads
every sample of a granary.torch.DistributedSampler order for --epochs epochs
through granary.Dataset map-style (`ds[i]` per sample), in a plain loop and
through a torch DataLoader with 0, 2 and 4 forked workers (--workers), and
through the DataLoader's batched path (`__getitems__`, no workers); the
baseline reads the same files from the local page cache with open()/read() in
the same order and loop shapes. Prints a table, the warm granary / local
ratios, the sidecar's peak RSS and window/arena gauges against the configured
window, checks every sample's bytes against the local file, and with --json
writes the figures. Everything it starts is stopped and the temporary
directory removed, also on failure, Ctrl-C and SIGTERM.

Run with the system Python (torch is a Debian package):
    /usr/bin/python3 bench/client_bench.py [--small] [--files N] [--epochs E]
        [--workers 0,2,4] [--window 64MiB] [--json FILE] [--build-dir build/release]
        [--keep]
docs/benchmarks.md ("Python client") describes the figures.
"""

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASET = "bench"
NODE_ID = "bench-node"
BATCH = 32
MEAN_SIZE = 110 * 1024
SIGMA = 0.5


def fail(message):
    raise SystemExit(f"client_bench: {message}")


def parse_bytes(text):
    m = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; write e.g. 64MiB, 512KiB or 1048576")
    value = int(m.group(1)) * {"B": 1, None: 1, "KiB": 1 << 10, "MiB": 1 << 20,
                               "GiB": 1 << 30}[m.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the window must be more than 0 bytes")
    return value


def worker_counts(text):
    try:
        counts = [int(part) for part in text.split(",") if part.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of worker counts; write e.g. 0,2,4") from None
    if not counts or any(c < 0 or c > 64 for c in counts) or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give distinct DataLoader worker counts from 0 to 64, e.g. 0,2,4")
    return counts


def positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
        return r.status, r.read().decode("utf-8", "replace")


def metrics(port):
    """{name: value} of the unlabelled samples (and labelled ones as name{labels})."""
    _, text = http_get(f"http://127.0.0.1:{port}/metrics")
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(" ", 1)
        if len(parts) == 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def vm_hwm(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ---- the dataset ------------------------------------------------------------------------


def generate(root, files, seed):
    """Class folders of 100 files, log-normal sizes with mean ~110 KiB; returns total bytes."""
    rng = random.Random(seed)
    mu = math.log(MEAN_SIZE) - SIGMA * SIGMA / 2
    classes = max(1, (files + 99) // 100)
    total = 0
    for i in range(files):
        d = os.path.join(root, f"n{i % classes:08d}")
        if i < classes:
            os.makedirs(d)
        size = min(4 << 20, max(1024, int(rng.lognormvariate(mu, SIGMA))))
        with open(os.path.join(d, f"n{i % classes:08d}_{i:07d}.JPEG"), "wb") as f:
            f.write(rng.randbytes(size))
        total += size
    return total


# ---- processes -----------------------------------------------------------------------------


class Processes:
    """The daemons this run started; stop() ends each (TERM, then KILL) by its pid."""

    def __init__(self):
        self.procs = []

    def start(self, name, argv, log_path):
        log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        # Own session: a terminal's Ctrl-C reaches only this script, which stops them.
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, p, log, log_path))
        return p

    def check_alive(self, p):
        if p.poll() is not None:
            for name, q, _, log_path in self.procs:
                if q is p:
                    with open(log_path, "rb") as f:
                        tail = f.read()[-3000:].decode("utf-8", "replace")
                    fail(f"{name} exited with status {p.returncode}; its log ends:\n{tail}")

    def stop(self):
        for name, p, log, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    print(f"client_bench: {name} did not stop within 15 s of SIGTERM; killing it",
                          file=sys.stderr)
                    p.kill()
                    p.wait()
            log.close()
        self.procs = []


def wait_ready(procs, p, port, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check_alive(p)
        try:
            status, _ = http_get(f"http://127.0.0.1:{port}/readyz", timeout=1.0)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    fail(f"{what} was not ready within {timeout:.0f} s (http://127.0.0.1:{port}/readyz)")


class GaugeWatcher(threading.Thread):
    """Scrapes the sidecar's /metrics every 0.25 s and keeps the peaks of its memory gauges."""

    NAMES = ("granary_sidecar_window_bytes", "granary_sidecar_window_samples",
             "granary_sidecar_arena_bytes", "granary_sidecar_arena_used_bytes",
             "granary_sidecar_pinned_bytes")

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.peak = {}
        self.errors = 0
        self.stopping = threading.Event()

    def scrape(self):
        try:
            m = metrics(self.port)
        except OSError:
            self.errors += 1
            return
        for name in self.NAMES:
            if name in m:
                self.peak[name] = max(self.peak.get(name, 0.0), m[name])

    def run(self):
        while not self.stopping.wait(0.25):
            self.scrape()


# ---- the timed loops ----------------------------------------------------------------------


class MapStyle:
    """Only __getitem__: the DataLoader calls ds[i] once per sample, as it does
    for any map-style dataset without __getitems__ (a user's wrapper, say)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[i]


class LocalFiles:
    """The baseline as a map-style dataset: item i is the bytes of local file i."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return f.read()


def plain_epoch(ds, sampler):
    count = 0
    nbytes = 0
    t0 = time.perf_counter()
    for i in sampler:
        b = ds[i]
        count += 1
        nbytes += len(b)
    return time.perf_counter() - t0, count, nbytes


def loader_epoch(loader):
    count = 0
    nbytes = 0
    t0 = time.perf_counter()
    for batch in loader:
        count += len(batch)
        for b in batch:
            nbytes += len(b)
    return time.perf_counter() - t0, count, nbytes


def identity(x):
    return x


# ---- main -----------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=positive, default=None, help="samples (default 5000)")
    ap.add_argument("--small", action="store_true", help="500 files (smoke run)")
    ap.add_argument("--epochs", type=positive, default=3, help="epochs per contender (default 3)")
    ap.add_argument("--workers", type=worker_counts, default=[0, 2, 4],
                    help="DataLoader worker counts, forked (default 0,2,4)")
    ap.add_argument("--window", type=parse_bytes, default=parse_bytes("64MiB"),
                    help="the sidecar's window_bytes (default 64MiB)")
    ap.add_argument("--no-handoff", action="store_true",
                    help="read the local cache node over TCP only (no chunk handoff socket)")
    ap.add_argument("--seed", type=int, default=42, help="dataset generator seed (default 42)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build", "release"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--pythonpath", metavar="DIR", default=None,
                    help="import granary from DIR (default: <build-dir>/python); an empty "
                         "string imports the granary installed in this interpreter (a venv "
                         "with the wheel)")
    args = ap.parse_args()
    files = args.files if args.files is not None else (500 if args.small else 5000)
    build = os.path.abspath(args.build_dir)

    binaries = {
        "cachenode": os.path.join(build, "cachenode", "granary-cachenode"),
        "cli": os.path.join(build, "cli", "granary"),
        "sidecar": os.path.join(build, "sidecar", "granary-sidecar"),
    }
    for name, path in binaries.items():
        if not os.access(path, os.X_OK):
            fail(f"no {name} binary at {path}; build it: cmake --preset release && cmake --build "
                 f"--preset release --target granary-cachenode granary granary-sidecar "
                 f"granary_python")
    pythonpath = os.path.join(build, "python") if args.pythonpath is None else args.pythonpath
    if pythonpath:
        sys.path.insert(0, os.path.abspath(pythonpath))
    try:
        import torch.utils.data

        import granary
        import granary.torch
    except ImportError as e:
        fail(f"cannot import torch or granary ({e}); run with /usr/bin/python3 (Debian's "
             f"python3-torch) after building granary_python into {build}/python, or with a "
             f"venv's python that has torch and the granary wheel and --pythonpath ''")
    print(f"granary {getattr(granary, '__version__', '(unversioned)')} from {os.path.dirname(granary.__file__)}, torch "
          f"{torch.__version__}, Python {sys.version.split()[0]}", flush=True)

    work = tempfile.mkdtemp(prefix="granary-client-bench.")
    procs = Processes()
    watcher = None
    ds = None

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    try:
        # 1. the dataset
        source = os.path.join(work, "imagenet")
        os.makedirs(source)
        t0 = time.perf_counter()
        total_bytes = generate(source, files, args.seed)
        print(f"dataset: {files} files, {total_bytes / 1e6:.1f} MB in {source} "
              f"({time.perf_counter() - t0:.1f} s to generate)", flush=True)

        # 2. cache node + dataset
        store = f"sqlite://{work}/granary.db"
        port, node_metrics = free_port(), free_port()
        # Cache nodes refuse to serve unauthenticated readers: the node, the
        # sidecar and the CLI share a cluster key, made in the temporary directory.
        key = os.path.join(work, "cluster.key")
        r = subprocess.run([binaries["cli"], "cluster-key", "generate", "--out", key, "--force"],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            fail(f"granary cluster-key generate exited {r.returncode}:\n{r.stdout}{r.stderr}")
        with open(os.path.join(work, "cachenode.yaml"), "w") as f:
            f.write(f"node_id: {NODE_ID}\nlisten: 127.0.0.1:{port}\n"
                    f"data_dir: {work}/cache\ncapacity: 8GiB\nmetadata_store: {store}\n"
                    f"metrics_listen: 127.0.0.1:{node_metrics}\ncluster_key_file: {key}\n"
                    + (f"local_socket: {work}/cachenode.sock\n" if not args.no_handoff else "")
                    + f"heartbeat_interval: 500ms\nheartbeat_ttl: 3s\nlog_level: warn\n")
        node = procs.start("granary-cachenode",
                           [binaries["cachenode"], "--config", f"{work}/cachenode.yaml"],
                           os.path.join(work, "cachenode.log"))
        wait_ready(procs, node, node_metrics, "granary-cachenode")
        t0 = time.perf_counter()
        for argv in (["dataset", "create", DATASET, "--source", source, "--chunk-size", "16MiB"],
                     ["dataset", "wait", DATASET, "--timeout", "10m"]):
            r = subprocess.run([binaries["cli"], "--store", store, "--cluster-key-file", key]
                               + argv, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                fail(f"granary {' '.join(argv)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
            procs.check_alive(node)
        staging_seconds = time.perf_counter() - t0
        print(f"staged on {NODE_ID} in {staging_seconds:.1f} s (create + wait)", flush=True)

        # 3. sidecar
        sock = os.path.join(work, "sidecar.sock")
        side_metrics = free_port()
        with open(os.path.join(work, "sidecar.yaml"), "w") as f:
            f.write(f"socket: {sock}\nmetadata_store: {store}\nlocal_node: {NODE_ID}\n"
                    f"cluster_key_file: {key}\n"
                    + (f"local_node_socket: {work}/cachenode.sock\n" if not args.no_handoff
                       else "")
                    + f"window_bytes: {args.window}\nmetrics_listen: 127.0.0.1:{side_metrics}\n"
                    f"log_level: warn\n")
        sidecar = procs.start("granary-sidecar",
                              [binaries["sidecar"], "--config", f"{work}/sidecar.yaml"],
                              os.path.join(work, "sidecar.log"))
        wait_ready(procs, sidecar, side_metrics, "granary-sidecar")
        watcher = GaugeWatcher(side_metrics)
        watcher.start()

        # 4/5. the contenders
        ds = granary.Dataset(DATASET, socket=sock)
        if len(ds) != files:
            fail(f"the sidecar reports {len(ds)} samples, the tree has {files}")
        local_paths = [os.path.join(source, p) for p in ds.paths()]
        local = LocalFiles(local_paths)
        for p in local_paths:  # the baseline reads from the page cache
            with open(p, "rb") as f:
                f.read()
        g_sampler = granary.torch.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True,
                                                     seed=0)
        l_sampler = granary.torch.DistributedSampler(local, num_replicas=1, rank=0, shuffle=True,
                                                     seed=0)
        def loader(dataset, sampler, workers):
            # Forked workers, kept for the whole run (each opens its own
            # session with the sidecar on first use); the same for both sides.
            extra = {} if workers == 0 else {"multiprocessing_context": "fork",
                                             "persistent_workers": True}
            return torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                               num_workers=workers, collate_fn=identity, **extra)

        # Map-style: ds[i] per sample (MapStyle hides __getitems__); batched:
        # granary.Dataset as it is, whose __getitems__ the DataLoader calls
        # with each batch (the local dataset has none: ds[i] per sample).
        contenders = [("granary_loop", lambda: plain_epoch(ds, g_sampler)),
                      ("local_loop", lambda: plain_epoch(local, l_sampler))]
        for w in args.workers:
            g_loader = loader(MapStyle(ds), g_sampler, w)
            l_loader = loader(local, l_sampler, w)
            contenders.append((f"granary_dataloader_w{w}", lambda g=g_loader: loader_epoch(g)))
            contenders.append((f"local_dataloader_w{w}", lambda l=l_loader: loader_epoch(l)))
        b_loader = loader(ds, g_sampler, 0)
        contenders.append(("granary_batched_w0", lambda: loader_epoch(b_loader)))
        rows = {name: [] for name, _ in contenders}
        for e in range(args.epochs):
            g_sampler.set_epoch(e)
            l_sampler.set_epoch(e)
            order = g_sampler.indices()
            if sorted(order) != list(range(files)) or l_sampler.indices() != order:
                fail(f"epoch {e}: the sampler's order is not every sample once, or the two "
                     f"samplers disagree")
            for name, run in contenders:
                seconds, count, nbytes = run()
                if count != files or nbytes != total_bytes:
                    fail(f"{name} epoch {e}: {count} samples, {nbytes} bytes; expected {files} "
                         f"samples, {total_bytes} bytes")
                phase = "cold" if (name == "granary_loop" and e == 0) else "warm"
                rows[name].append({"epoch": e, "phase": phase, "seconds": seconds,
                                   "samples_per_s": count / seconds,
                                   "mb_per_s": nbytes / seconds / 1e6})
                print(f"  {name:<22} epoch {e} ({phase}) {seconds:7.3f} s "
                      f"{count / seconds:10,.0f} samples/s", flush=True)
                procs.check_alive(sidecar)

        # 6. verification pass (untimed): every sample's bytes against the local file
        mismatched = []
        for i in range(files):
            got = hashlib.blake2b(ds[i], digest_size=16).digest()
            with open(local_paths[i], "rb") as f:
                want = hashlib.blake2b(f.read(), digest_size=16).digest()
            if got != want:
                mismatched.append(ds.path(i))
        verified = not mismatched

        watcher.stopping.set()
        watcher.join()
        watcher.scrape()
        final = metrics(side_metrics)
        rss = {"sidecar": vm_hwm(sidecar.pid), "cachenode": vm_hwm(node.pid)}
        ds.close()
        ds = None

        def speed(name, warm_only):
            rs = [r for r in rows[name] if not warm_only or r["phase"] == "warm"]
            rs = rs or rows[name]
            return files * len(rs) / sum(r["seconds"] for r in rs)

        ratios = {"warm_vs_local_loop": speed("granary_loop", True) / speed("local_loop", False)}
        for w in args.workers:
            ratios[f"warm_vs_local_dataloader_w{w}"] = (
                speed(f"granary_dataloader_w{w}", True) / speed(f"local_dataloader_w{w}", False))
        if 0 in args.workers:
            ratios["warm_batched_vs_local_dataloader_w0"] = (
                speed("granary_batched_w0", True) / speed("local_dataloader_w0", False))
        ratios["cold_vs_local_loop"] = (rows["granary_loop"][0]["samples_per_s"] /
                                        speed("local_loop", False))

        print()
        print(f"{'contender':<22} {'epoch':>5} {'phase':<5} {'seconds':>8} {'samples/s':>10} "
              f"{'MB/s':>8}")
        for name, rs in rows.items():
            for r in rs:
                print(f"{name:<22} {r['epoch']:>5} {r['phase']:<5} {r['seconds']:8.3f} "
                      f"{r['samples_per_s']:10,.0f} {r['mb_per_s']:8.1f}")
        print()
        print(f"warm granary / local, plain loop (ds[i]):          "
              f"{ratios['warm_vs_local_loop']:.2f}")
        for w in args.workers:
            print(f"warm granary / local, DataLoader {w} workers (ds[i]): "
                  f"{ratios[f'warm_vs_local_dataloader_w{w}']:.2f}")
        if 0 in args.workers:
            print(f"warm granary batched (__getitems__) / local, 0 workers: "
                  f"{ratios['warm_batched_vs_local_dataloader_w0']:.2f}")
        print(f"cold granary / local, plain loop:                  "
              f"{ratios['cold_vs_local_loop']:.2f}")
        mib = 1 << 20

        def show(v):
            return "n/a" if v is None else f"{v / mib:.1f} MiB"

        peak = watcher.peak
        print(f"sidecar peak RSS (VmHWM): {show(rss['sidecar'])}; cache node: "
              f"{show(rss['cachenode'])}")
        print(f"sidecar window_bytes: peak {show(peak.get('granary_sidecar_window_bytes'))} "
              f"(configured window {show(args.window)}); arena_bytes "
              f"{show(final.get('granary_sidecar_arena_bytes'))}, arena_used_bytes peak "
              f"{show(peak.get('granary_sidecar_arena_used_bytes'))}"
              f"{'' if not watcher.errors else f' ({watcher.errors} scrapes failed)'}")
        served = {k: v for k, v in final.items()
                  if k.startswith(("granary_sidecar_served_samples_total",
                                   "granary_sidecar_fetched_samples_total",
                                   "granary_sidecar_failed_samples_total",
                                   "granary_sidecar_evictions_total",
                                   "granary_sidecar_local_file_"))}
        for k, v in sorted(served.items()):
            print(f"  {k} {v:.0f}")
        print(f"verified: {'every sample matches its local file' if verified else mismatched[:10]}")

        if args.json:
            out = {
                "dataset": {"files": files, "bytes": total_bytes, "seed": args.seed},
                "setup": {"staging_seconds": staging_seconds, "window_bytes": args.window,
                          "batch_size": BATCH, "epochs": args.epochs, "workers": args.workers},
                "contenders": rows,
                "ratios": ratios,
                "peak_rss_bytes": rss,
                "sidecar_gauges_peak": peak,
                "sidecar_final": {k: final.get(k) for k in GaugeWatcher.NAMES},
                "sidecar_counters": served,
                "verified": verified,
            }
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
            print(f"figures written to {args.json}")
        return 0 if verified else 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if watcher is not None:
            watcher.stopping.set()
        if ds is not None:
            ds.close()
        procs.stop()
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


if __name__ == "__main__":
    sys.exit(main())
