"""A single-host Granary in a work directory, for scripts (quick start, demos).

One granary-cachenode on an embedded SQLite store, the granary CLI against the
same store, and one granary-sidecar reading the node's chunk files through
its chunk handoff socket; all three use a cluster key made in the work
directory. Everything started here runs in its own session (a terminal's
Ctrl-C reaches only the script) and dies with the script if the script is
killed (PR_SET_PDEATHSIG); ``stop()`` ends each with SIGTERM, then SIGKILL
after a timeout, newest first. Use as a context manager.

    with LocalGranary(work_dir, build_dir) as g:
        g.start_cachenode()
        g.cli("dataset", "create", "imagenet", "--source", src)
        g.cli("dataset", "wait", "imagenet")
        g.start_sidecar()
        ...  # granary.Dataset("imagenet", socket=g.socket)
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

NODE_ID = "local-node"


class GranaryError(Exception):
    """A daemon or CLI call failed; the message says which and shows its log."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1.0) as r:
            return r.status == 200
    except OSError:
        return False


class LocalGranary:
    def __init__(self, work, build, log_level="warn"):
        self.work = os.path.abspath(work)
        build = os.path.abspath(build)
        self.bin = {
            "cachenode": os.path.join(build, "cachenode", "granary-cachenode"),
            "sidecar": os.path.join(build, "sidecar", "granary-sidecar"),
            "cli": os.path.join(build, "cli", "granary"),
        }
        for name, path in self.bin.items():
            if not os.access(path, os.X_OK):
                raise GranaryError(f"{path} is missing: build first (make release)")
        self.python_path = os.path.join(build, "python")
        self.store = f"sqlite://{self.work}/granary.db"
        self.node_socket = os.path.join(self.work, "cachenode.sock")
        self.socket = os.path.join(self.work, "sidecar.sock")
        self.log_level = log_level
        self.procs = []  # [name, Popen, log file, log path]
        # Cache nodes refuse to serve unauthenticated readers, so the node, the
        # sidecar and the CLI share a cluster key; it lives in the work directory
        # (removed with it), never in /etc/granary.
        self.cluster_key = os.path.join(self.work, "cluster.key")
        r = subprocess.run([self.bin["cli"], "cluster-key", "generate", "--out", self.cluster_key,
                            "--force"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, check=False)
        if r.returncode != 0:
            raise GranaryError(f"granary cluster-key generate exited {r.returncode}:\n{r.stdout}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    # ---- processes ----------------------------------------------------------------

    def _start(self, name, argv):
        log_path = os.path.join(self.work, f"{name}.log")
        out = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=_die_with_parent)
        self.procs.append([name, p, out, log_path])
        return p

    def _log_tail(self, p, nbytes=3000):
        for name, q, _, log_path in self.procs:
            if q is p:
                with open(log_path, "rb") as f:
                    return name, f.read()[-nbytes:].decode("utf-8", "replace")
        return "?", ""

    def check_alive(self):
        for name, p, _, _ in self.procs:
            if p.poll() is not None:
                _, tail = self._log_tail(p)
                raise GranaryError(f"{name} exited with status {p.returncode}; its log ends:\n{tail}")

    def _wait_ready(self, p, port, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if _ready(port):
                return
            time.sleep(0.05)
        name, tail = self._log_tail(p)
        raise GranaryError(f"{name} was not ready within {timeout:.0f} s; its log ends:\n{tail}")

    def pids(self):
        return {name: p.pid for name, p, _, _ in self.procs if p.poll() is None}

    def stop(self, timeout=20):
        for entry in reversed(list(self.procs)):
            name, p, out, _ = entry
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    print(f"{name} did not stop within {timeout} s of SIGTERM; killing it",
                          file=sys.stderr)
                    p.kill()
                    p.wait()
            out.close()
            self.procs.remove(entry)

    # ---- the parts --------------------------------------------------------------------

    def start_cachenode(self, capacity="8GiB"):
        port, metrics = free_port(), free_port()
        config = os.path.join(self.work, "cachenode.yaml")
        with open(config, "w") as f:
            f.write(f"node_id: {NODE_ID}\nlisten: 127.0.0.1:{port}\n"
                    f"data_dir: {self.work}/cache\ncapacity: {capacity}\n"
                    f"metadata_store: {self.store}\nmetrics_listen: 127.0.0.1:{metrics}\n"
                    f"local_socket: {self.node_socket}\ncluster_key_file: {self.cluster_key}\n"
                    f"heartbeat_interval: 500ms\nheartbeat_ttl: 3s\nlog_level: {self.log_level}\n")
        p = self._start("granary-cachenode", [self.bin["cachenode"], "--config", config])
        self._wait_ready(p, metrics)
        self.node_metrics_port = metrics
        return p

    def start_sidecar(self, window="64MiB", arena=None):
        metrics = free_port()
        config = os.path.join(self.work, "sidecar.yaml")
        with open(config, "w") as f:
            f.write(f"socket: {self.socket}\nmetadata_store: {self.store}\n"
                    f"local_node: {NODE_ID}\nlocal_node_socket: {self.node_socket}\n"
                    f"window_bytes: {window}\nmetrics_listen: 127.0.0.1:{metrics}\n"
                    f"cluster_key_file: {self.cluster_key}\n"
                    + (f"arena_bytes: {arena}\n" if arena else "")
                    + f"log_level: {self.log_level}\n")
        p = self._start("granary-sidecar", [self.bin["sidecar"], "--config", config])
        self._wait_ready(p, metrics)
        self.sidecar_metrics_port = metrics
        return p

    def cli(self, *argv, capture=False):
        """Runs `granary --store <store> --cluster-key-file <key> argv...`; its
        progress goes to this terminal unless `capture`. Returns stdout when
        capturing."""
        r = subprocess.run([self.bin["cli"], "--store", self.store,
                            "--cluster-key-file", self.cluster_key, *argv],
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.PIPE if capture else None, text=True, check=False)
        self.check_alive()
        if r.returncode != 0:
            detail = (r.stdout or "") + (r.stderr or "") if capture else ""
            raise GranaryError(f"granary {' '.join(argv)} exited {r.returncode}" +
                               (f":\n{detail}" if detail else " (see above)"))
        return r.stdout if capture else None
