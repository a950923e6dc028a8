#!/usr/bin/python3
"""Granary's image under containerd and runc, each container as the chart runs it.

A private containerd (its own root, state and socket in a temporary directory,
the CRI plugin off) imports the image that scripts/image/assemble makes from
the build under test, and runs, through `ctr run` with an OCI spec written here
from the pod specs' securityContexts (charts/granary/templates/operator-
deployment.yaml, the operator's generated cache-node DaemonSet and injected
sidecar):

  operator   uid/gid 65532, read-only root, no capabilities, no privilege
             escalation, containerd's default seccomp profile: --version and
             --help exit 0; without a cluster to talk to it exits 1 saying why.
  cachenode  uid 0 with only SETUID and SETGID, read-only root, host network,
             a hostPath-like data dir and the source bind-mounted: /readyz
             answers on the host, and it stages a dataset from the source.
  sidecar    the dataset owner's uid (65532), no capabilities, read-only root,
             reaching that cache node through its handoff socket.
  granary    the CLI in the image, as uid 65532, creates the dataset and reads
             samples back through the sidecar byte-exact.

The metadata store is a redis-server of the test's on 127.0.0.1 (host network).
Everything is removed at the end, also on failure: tasks, containers, the image
mount and snapshots, containerd, redis and the directory (check-test-leftovers
looks for granary-test-*). Skips (exit 77) saying why where it cannot run: not
root, no containerd, runc or redis-server, no overlay file system.

  tests/integration/container_image_test.py --source-dir . --build-dir build/release
      [--image ARCHIVE]   # an archive made before (else assembled here)
"""
import argparse
import ctypes
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

SKIP = 77
NODE_ID = "ctr-node"
OWNER = 65532  # the image's user, and the dataset owner (a Dataset's runAs)
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Failure(Exception):
    pass


def say(text):
    print(text, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """containerd and redis-server end when the test does, even when killed
    (a ctest time-out); containerd's shims then stop their containers."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def http_status(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def skip_reason():
    if os.geteuid() != 0:
        return "needs root (containerd and runc)"
    for tool in ("containerd", "ctr", "runc", "containerd-shim-runc-v2", "redis-server"):
        if shutil.which(tool) is None:
            return (f"{tool} is not installed (apt-get install containerd runc redis-server)")
    with open("/proc/filesystems") as f:
        if "overlay" not in f.read():
            return "the kernel has no overlay file system (containerd's overlayfs snapshotter)"
    return None


class Containerd:
    """A containerd of the test's own: root, state and socket under `work`."""

    def __init__(self, work):
        self.work = work
        self.address = os.path.join(work, "containerd.sock")
        self.ns = "granary-test"
        self.proc = None
        self.log_path = os.path.join(work, "containerd.log")

    def start(self):
        config = os.path.join(self.work, "containerd.toml")
        disabled = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper"]
        with open(config, "w") as f:
            f.write(f'version = 2\nroot = "{self.work}/containerd-root"\n'
                    f'state = "{self.work}/containerd-state"\n'
                    f"disabled_plugins = {json.dumps(disabled)}\n"
                    f'[grpc]\n  address = "{self.address}"\n'
                    f'[ttrpc]\n  address = "{self.address}.ttrpc"\n'
                    '[debug]\n  address = ""\n[metrics]\n  address = ""\n')
        log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(["containerd", "--config", config], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failure(f"containerd exited {self.proc.returncode}: {self.log_tail()}")
            if self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise Failure(f"containerd did not answer within 30 s: {self.log_tail()}")

    def log_tail(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-2000:].decode("utf-8", "replace")

    def ctr(self, *argv, check=True, timeout=120, **kw):
        r = subprocess.run(["ctr", "--address", self.address, "-n", self.ns, *argv],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           check=False, **kw)
        if check and r.returncode != 0:
            raise Failure(f"ctr {' '.join(argv)} exited {r.returncode}: "
                          f"{r.stderr.decode(errors='replace').strip()}")
        return r

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ImageRunner:
    """Runs containers of one image, each with a spec written from a securityContext."""

    def __init__(self, containerd, work, image):
        self.c = containerd
        self.work = work
        self.image = image
        self.rootfs = os.path.join(work, "rootfs")
        self.running = []  # detached container ids
        self.mounted = False
        self.seccomp = None

    def prepare(self):
        os.makedirs(self.rootfs)
        # One writable view of the image for every container: runc makes the
        # mount points in it, and each container's root is read-only (the
        # chart's readOnlyRootFilesystem), as the kubelet's are.
        self.c.ctr("images", "mount", "--rw", self.image, self.rootfs)
        self.mounted = True
        # containerd's default seccomp profile (what RuntimeDefault means under
        # containerd), and the image config's environment, from a container that
        # is created, looked at and removed.
        self.c.ctr("containers", "create", "--seccomp", self.image, "spec-probe")
        try:
            info = json.loads(self.c.ctr("containers", "info", "spec-probe").stdout)
        finally:
            self.c.ctr("containers", "rm", "spec-probe", check=False)
        self.seccomp = info["Spec"]["linux"]["seccomp"]
        self.image_env = info["Spec"]["process"].get("env") or [PATH_ENV]
        # What `privileged: true` means to containerd: every capability, every
        # host device, nothing masked.
        self.c.ctr("containers", "create", "--privileged", self.image, "privileged-probe")
        try:
            info = json.loads(self.c.ctr("containers", "info", "privileged-probe").stdout)
        finally:
            self.c.ctr("containers", "rm", "privileged-probe", check=False)
        self.privileged = info["Spec"]
        self.default = json.loads(subprocess.run(["ctr", "oci", "spec"], stdout=subprocess.PIPE,
                                                 check=True).stdout)

    def spec(self, args, uid, gid, caps=(), host_network=True, mounts=(), env=(),
             seccomp=True):
        s = json.loads(json.dumps(self.default))
        s["root"] = {"path": self.rootfs, "readonly": True}  # readOnlyRootFilesystem
        p = s["process"]
        p["args"] = list(args)
        p["env"] = list(self.image_env) + list(env)
        p["cwd"] = "/var/lib/granary"
        p["user"] = {"uid": uid, "gid": gid}
        p["noNewPrivileges"] = True  # allowPrivilegeEscalation: false
        names = [f"CAP_{c}" for c in caps]  # drop: [ALL], add: caps
        p["capabilities"] = {k: list(names) for k in ("bounding", "effective", "permitted")}
        p["capabilities"]["inheritable"] = []
        p["capabilities"]["ambient"] = []
        p.pop("terminal", None)
        # A pod's container has no tmpfs /run of its own (ctr's default adds one).
        s["mounts"] = [m for m in s["mounts"] if m["destination"] != "/run"]
        for mount in mounts:
            src, dst, ro = mount[:3]
            options = ["rbind", "ro" if ro else "rw"]
            if len(mount) > 3:  # mountPropagation: Bidirectional (rshared), HostToContainer (rslave)
                options.append(mount[3])
                if mount[3] == "rshared":
                    s["linux"]["rootfsPropagation"] = "rshared"
            s["mounts"].append({"destination": dst, "type": "bind", "source": src,
                                "options": options})
        linux = s["linux"]
        if host_network:  # hostNetwork: true
            linux["namespaces"] = [n for n in linux["namespaces"] if n["type"] != "network"]
        linux.pop("cgroupsPath", None)
        if seccomp:
            linux["seccomp"] = self.seccomp  # seccompProfile: RuntimeDefault
        return s

    def privileged_spec(self, args, uid, gid, mounts=(), env=()):
        """privileged: true, as containerd makes it (the sidecar's POSIX view)."""
        s = self.spec(args, uid, gid, mounts=mounts, env=env, seccomp=False)
        s["process"]["capabilities"] = self.privileged["process"]["capabilities"]
        s["process"]["noNewPrivileges"] = False
        s["process"].pop("apparmorProfile", None)
        linux, priv = s["linux"], self.privileged["linux"]
        linux["devices"] = priv.get("devices", [])
        linux.setdefault("resources", {})["devices"] = priv.get("resources", {}).get("devices", [])
        linux.pop("maskedPaths", None)
        linux.pop("readonlyPaths", None)
        linux.pop("seccomp", None)
        for m in s["mounts"]:
            if m["destination"] == "/sys":  # writable sysfs
                m["options"] = [o for o in m["options"] if o != "ro"] + ["rw"]
        return s

    def _write_spec(self, cid, spec):
        path = os.path.join(self.work, f"{cid}.spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return path

    def run(self, cid, spec, timeout=120):
        """Runs to completion; returns (exit code, stdout, stderr)."""
        path = self._write_spec(cid, spec)
        r = self.c.ctr("run", "--rm", "--config", path, cid, check=False, timeout=timeout)
        self.last_stdout = r.stdout  # the bytes, for what reads data back
        out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        return r.returncode, out, err

    def start(self, cid, spec):
        path = self._write_spec(cid, spec)
        log = os.path.join(self.work, f"{cid}.log")
        self.c.ctr("run", "--detach", "--log-uri", f"file://{log}", "--config", path, cid)
        self.running.append(cid)
        return log

    def alive(self, cid):
        r = self.c.ctr("tasks", "ls", check=False)
        for line in r.stdout.decode().splitlines()[1:]:
            f = line.split()
            if f and f[0] == cid:
                return f[-1] == "RUNNING"
        return False

    def stop(self, cid, timeout=20):
        """SIGTERM, as the kubelet stops a container (SIGKILL after `timeout`);
        returns whether it had stopped before the SIGKILL."""
        self.c.ctr("tasks", "kill", "--signal", "SIGTERM", cid, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive(cid):
            time.sleep(0.1)
        if self.alive(cid):
            self.c.ctr("tasks", "kill", "--signal", "SIGKILL", cid, check=False)
            time.sleep(0.5)
        stopped = not self.alive(cid)
        self.c.ctr("tasks", "rm", "--force", cid, check=False)
        self.c.ctr("containers", "rm", cid, check=False)
        if cid in self.running:
            self.running.remove(cid)
        return stopped

    def teardown(self):
        for cid in list(self.running):
            self.stop(cid, timeout=10)
        if self.mounted:
            self.c.ctr("images", "unmount", "--rm", self.rootfs, check=False)
            self.mounted = False


def security_probe():
    """What a container sees of its identity and privileges (sh and grep: the image's)."""
    return ["sh", "-c",
            'echo "uid=$(id -u) gid=$(id -g)"; '
            'grep -E "^(CapPrm|CapEff|CapBnd|NoNewPrivs|Seccomp):" /proc/self/status; '
            # / is root's; /var/lib/granary (the working directory) is uid 65532's.
            'root=read-only; for d in / /var/lib/granary; do '
            'touch "$d/.granary-probe" 2>/dev/null && root=writable; done; echo "root=$root"']


def check_probe(out, uid, gid, caps_hex):
    want = {"uid": str(uid), "gid": str(gid), "CapPrm": caps_hex, "CapEff": caps_hex,
            "CapBnd": caps_hex, "NoNewPrivs": "1", "Seccomp": "2", "root": "read-only"}
    seen = {}
    for line in out.split("\n"):
        for part in line.replace(":\t", "=").replace(": ", "=").split():
            if "=" in part:
                k, v = part.split("=", 1)
                seen[k] = v.strip()
    wrong = {k: (seen.get(k), v) for k, v in want.items() if seen.get(k) != v}
    if wrong:
        raise Failure("security context not as the chart says (seen, wanted): "
                      f"{wrong}; the probe printed:\n{out}")


class Test:
    def __init__(self, args):
        self.args = args
        self.source_dir = os.path.abspath(args.source_dir)
        self.build_dir = os.path.abspath(args.build_dir)
        self.results = []

    def case(self, name, fn):
        t0 = time.monotonic()
        try:
            fn()
        except Failure as e:
            self.results.append((name, False))
            say(f"FAIL {name} ({time.monotonic() - t0:.1f} s): {e}")
            return False
        self.results.append((name, True))
        say(f"ok   {name} ({time.monotonic() - t0:.1f} s)")
        return True

    def main(self):
        work = tempfile.mkdtemp(prefix="granary-test-container.", dir="/tmp")
        os.chmod(work, 0o755)
        self.work = work
        self.containerd = Containerd(work)
        self.redis = None
        self.runner = None
        self.host_mounts = []  # the test's own, detached in teardown
        try:
            self.setup()
            self.run_cases()
        except Failure as e:
            self.results.append(("setup", False))
            say(f"FAIL setup: {e}")
        except KeyboardInterrupt:
            self.results.append(("interrupted", False))
            say("FAIL interrupted: tearing down")
        finally:
            self.teardown()
        passed = sum(1 for _, ok in self.results if ok)
        failed = len(self.results) - passed
        say(f"{passed} passed, {failed} failed")
        return 0 if failed == 0 and passed > 0 else 1

    # ---- the fixture ------------------------------------------------------------------

    def setup(self):
        image = self.args.image
        t0 = time.monotonic()
        if image is None:
            image = os.path.join(self.work, "image.oci.tar")
            r = subprocess.run([os.path.join(self.source_dir, "scripts/image/assemble"),
                                "--build-dir", self.build_dir, "--output", image],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
            if r.returncode != 0:
                raise Failure(f"scripts/image/assemble exited {r.returncode}:\n"
                              f"{r.stdout.decode(errors='replace')[-3000:]}")
        say(f"image archive {image}: {os.path.getsize(image) / 2**20:.1f} MiB "
            f"({time.monotonic() - t0:.1f} s)")
        self.image_name = archive_image_name(image)
        self.containerd.start()
        t0 = time.monotonic()
        self.containerd.ctr("images", "import", image, timeout=300)
        say(f"imported {self.image_name} into a private containerd "
            f"({time.monotonic() - t0:.1f} s)")
        self.runner = ImageRunner(self.containerd, self.work, self.image_name)
        self.runner.prepare()

        # The host side of the pods' volumes.
        w = self.work
        self.paths = {k: os.path.join(w, k) for k in
                      ("hostpath", "node-socket", "sidecar-run", "config", "key", "source")}
        for p in self.paths.values():
            os.makedirs(p, mode=0o755)
        os.chown(self.paths["sidecar-run"], OWNER, OWNER)
        # The cluster key, 0600 as the daemons demand: the cache node's (root) and a
        # copy owned by the sidecar's and the CLI's uid (a Secret mounted with
        # their fsGroup would be the same).
        key = os.path.join(self.paths["key"], "root", "key")
        os.makedirs(os.path.dirname(key), mode=0o755)
        subprocess.run([os.path.join(self.build_dir, "cli", "granary"), "cluster-key",
                        "generate", "--out", key, "--force"], check=True,
                       stdout=subprocess.DEVNULL)
        os.chmod(key, 0o600)
        owner_key = os.path.join(self.paths["key"], "owner", "key")
        os.makedirs(os.path.dirname(owner_key), mode=0o755)
        shutil.copyfile(key, owner_key)
        os.chmod(owner_key, 0o600)
        os.chown(owner_key, OWNER, OWNER)
        # A small dataset owned by its owner (the cache node reads it as that uid).
        self.samples = {}
        for c in range(3):
            d = os.path.join(self.paths["source"], f"class{c}")
            os.makedirs(d)
            for i in range(20):
                data = hashlib.sha256(f"{c}/{i}".encode()).digest() * (300 + 97 * i)
                rel = f"class{c}/sample{i:03d}.bin"
                with open(os.path.join(self.paths["source"], rel), "wb") as f:
                    f.write(data)
                self.samples[rel] = data
        for dirpath, dirnames, filenames in os.walk(self.paths["source"]):
            os.chown(dirpath, OWNER, OWNER)
            for f in filenames:
                os.chown(os.path.join(dirpath, f), OWNER, OWNER)

        self.redis_port = free_port()
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.work],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent)
        self.store = f"redis://127.0.0.1:{self.redis_port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.redis_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise Failure("redis-server did not listen within 10 s")
                time.sleep(0.05)

    def teardown(self):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut it short
        if self.runner:
            self.runner.teardown()
        self.containerd.stop()
        if self.redis and self.redis.poll() is None:
            self.redis.terminate()
            self.redis.wait(timeout=10)
        for point in reversed(self.host_mounts):
            subprocess.run(["umount", "-l", point], check=False)
        left = [line.split()[4] for line in open("/proc/self/mountinfo")
                if line.split()[4].startswith(self.work)]
        for point in sorted(left, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        if self.args.keep:
            say(f"kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        if left:
            self.results.append(("no-leftover-mounts", False))
            say(f"FAIL mounts left under {self.work} after teardown: {left}")

    # ---- the cases --------------------------------------------------------------------

    def run_cases(self):
        self.case("operator: uid 65532, read-only root, no capabilities", self.operator_context)
        self.case("operator: --help, and refuses to start without a cluster", self.operator_runs)
        if not self.case("cachenode: root with SETUID/SETGID only, /readyz on the host",
                         self.cachenode_starts):
            return
        if not self.case("granary CLI (uid 65532): dataset created and staged from the source",
                         self.dataset_staged):
            return
        if not self.case("sidecar: uid 65532, no capabilities, ready against the cache node",
                         self.sidecar_starts):
            return
        self.case("granary CLI reads every sample through the sidecar byte-exact", self.read_back)
        if os.path.exists("/dev/fuse"):
            self.case("POSIX view: a privileged sidecar mounts it, a trainer (uid 65532, "
                      "no capabilities) reads every file by path byte-exact", self.posix_view)
        else:
            say("     no /dev/fuse on this host: the POSIX view case is not run")
        self.case("cachenode and sidecar stop on SIGTERM", self.daemons_stop)

    def operator_spec(self, args):
        return self.runner.spec(args, uid=OWNER, gid=OWNER, caps=(), host_network=False)

    def operator_context(self):
        code, out, err = self.runner.run("operator-probe", self.operator_spec(security_probe()))
        if code != 0:
            raise Failure(f"the probe exited {code}: {err}")
        check_probe(out, OWNER, OWNER, "0000000000000000")

    def operator_runs(self):
        for flag in ("--help",):  # no daemon has a --version flag
            code, out, err = self.runner.run("operator-flag", self.operator_spec(
                ["granary-operator", flag]))
            if code != 0 or not out.strip():
                raise Failure(f"granary-operator {flag} exited {code}: {out}{err}")
        code, out, err = self.runner.run("operator-bare", self.operator_spec(
            ["granary-operator", "--namespace=granary-system"]))
        said = (out + err).strip()
        if code == 0 or not said:
            raise Failure(f"granary-operator without a cluster exited {code}, saying {said!r}")
        say(f"     granary-operator without a cluster: exit {code}: {said.splitlines()[-1]}")

    def cachenode_spec(self, args):
        p = self.paths
        mounts = [(p["hostpath"], "/var/lib/granary-pool", False),  # the pool's hostPath
                  (p["node-socket"], "/run/granary-node", False),
                  (p["config"], "/etc/granary/config", True),
                  (os.path.join(p["key"], "root"), "/etc/granary/cluster-key", True),
                  (p["source"], "/data/source", True)]  # a sourceMount, read-only
        return self.runner.spec(args, uid=0, gid=0, caps=("SETUID", "SETGID"), mounts=mounts)

    def cachenode_starts(self):
        code, out, err = self.runner.run("cachenode-probe", self.cachenode_spec(security_probe()))
        if code != 0:
            raise Failure(f"the probe exited {code}: {err}")
        check_probe(out, 0, 0, "00000000000000c0")  # CAP_SETGID (6) and CAP_SETUID (7)
        self.node_port, self.node_metrics = free_port(), free_port()
        with open(os.path.join(self.paths["config"], "cachenode.yaml"), "w") as f:
            f.write(f"node_id: {NODE_ID}\npool: default\nlisten: 127.0.0.1:{self.node_port}\n"
                    "data_dir: /var/lib/granary-pool/default\ncapacity: 1GiB\n"
                    f"metadata_store: {self.store}\n"
                    f"metrics_listen: 127.0.0.1:{self.node_metrics}\n"
                    "local_socket: /run/granary-node/cachenode.sock\n"
                    "cluster_key_file: /etc/granary/cluster-key/key\n"
                    "heartbeat_interval: 500ms\nheartbeat_ttl: 3s\nlog_level: info\n")
        self.node_log = self.runner.start("cachenode", self.cachenode_spec(
            ["granary-cachenode", "--config=/etc/granary/config/cachenode.yaml",
             f"--node-id={NODE_ID}", f"--advertise=127.0.0.1:{self.node_port}"]))
        self.wait_ready("cachenode", self.node_metrics, self.node_log)
        chunks = os.path.join(self.paths["hostpath"], "default")
        if not os.path.isdir(chunks):
            raise Failure(f"the cache node made no data dir in its hostPath ({chunks})")

    def wait_ready(self, cid, port, log, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.runner.alive(cid):
                raise Failure(f"{cid} exited; its log ends:\n{tail(log)}")
            if http_status(port, "/readyz") == 200:
                return
            time.sleep(0.1)
        raise Failure(f"{cid}'s /readyz on 127.0.0.1:{port} was not 200 within {timeout} s; "
                      f"its log ends:\n{tail(log)}")

    def cli_spec(self, args):
        p = self.paths
        return self.runner.spec(
            ["granary", "--store", self.store, "--cluster-key-file",
             "/etc/granary/cluster-key/key", *args], uid=OWNER, gid=OWNER,
            mounts=[(os.path.join(p["key"], "owner"), "/etc/granary/cluster-key", True),
                    (p["source"], "/data/source", True),
                    (p["sidecar-run"], "/run/granary", True)])

    def dataset_staged(self):
        code, out, err = self.runner.run("cli-create", self.cli_spec(
            ["dataset", "create", "tiny", "--source", "/data/source", "--chunk-size", "64KiB"]))
        if code != 0:
            raise Failure(f"granary dataset create exited {code}: {out}{err}")
        code, out, err = self.runner.run("cli-wait", self.cli_spec(
            ["dataset", "wait", "tiny", "--timeout", "90s"]), timeout=150)
        if code != 0:
            raise Failure(f"granary dataset wait exited {code}: {out}{err}\n"
                          f"cache node log:\n{tail(self.node_log)}")
        chunks = sum(len(fs) for _, _, fs in os.walk(os.path.join(self.paths["hostpath"],
                                                                   "default")))
        if chunks == 0:
            raise Failure("staged, but no file in the cache node's hostPath data dir")
        say(f"     staged {len(self.samples)} samples; {chunks} files in the hostPath data dir")

    def sidecar_starts(self):
        p = self.paths
        self.sidecar_metrics = free_port()
        with open(os.path.join(p["config"], "sidecar.yaml"), "w") as f:
            f.write(f"socket: /run/granary/sidecar.sock\nmetadata_store: {self.store}\n"
                    f"local_node: {NODE_ID}\n"
                    "local_node_socket: /run/granary-node/cachenode.sock\n"
                    f"metrics_listen: 127.0.0.1:{self.sidecar_metrics}\n"
                    "cluster_key_file: /etc/granary/cluster-key/key\nlog_level: info\n")
        mounts = [(p["sidecar-run"], "/run/granary", False),
                  (p["node-socket"], "/run/granary-node", True),
                  (p["config"], "/etc/granary/config", True),
                  (os.path.join(p["key"], "owner"), "/etc/granary/cluster-key", True)]

        def spec(args):
            return self.runner.spec(args, uid=OWNER, gid=OWNER, caps=(), mounts=mounts)

        code, out, err = self.runner.run("sidecar-probe", spec(security_probe()))
        if code != 0:
            raise Failure(f"the probe exited {code}: {err}")
        check_probe(out, OWNER, OWNER, "0000000000000000")
        self.sidecar_log = self.runner.start("sidecar", spec(
            ["granary-sidecar", "--config=/etc/granary/config/sidecar.yaml",
             f"--local-node={NODE_ID}"]))
        self.wait_ready("sidecar", self.sidecar_metrics, self.sidecar_log)

    def read_back(self):
        names = sorted(self.samples)
        code, out, err = self.runner.run("cli-cat", self.cli_spec(
            ["cat", "tiny", *names, "--socket", "/run/granary/sidecar.sock"]))
        if code != 0:
            raise Failure(f"granary cat exited {code}: {err}\nsidecar log:\n"
                          f"{tail(self.sidecar_log)}")
        # cat writes the files one after another, in the order given.
        got = self.runner.last_stdout
        want = b"".join(self.samples[n] for n in names)
        if got != want:
            raise Failure(f"granary cat wrote {len(got)} bytes, not the {len(want)} of the "
                          f"source's files (first difference at byte "
                          f"{first_difference(got, want)})")
        say(f"     {len(names)} samples, {len(want)} bytes, byte-exact")

    def posix_view(self):
        p = self.paths
        view = os.path.join(self.work, "view")
        run = os.path.join(self.work, "view-sidecar-run")
        os.makedirs(os.path.join(view, "tiny"))
        os.makedirs(run)
        # The kubelet needs a Bidirectional volume's host path on a shared mount.
        subprocess.run(["mount", "--bind", view, view], check=True)
        self.host_mounts.append(view)
        subprocess.run(["mount", "--make-rshared", view], check=True)
        metrics = free_port()
        with open(os.path.join(p["config"], "sidecar-view.yaml"), "w") as f:
            f.write(f"socket: /run/granary/sidecar.sock\nmetadata_store: {self.store}\n"
                    f"local_node: {NODE_ID}\n"
                    "local_node_socket: /run/granary-node/cachenode.sock\n"
                    f"metrics_listen: 127.0.0.1:{metrics}\n"
                    "cluster_key_file: /etc/granary/cluster-key/key\n"
                    'mounts: "tiny:/mnt/granary/tiny"\nlog_level: info\n')
        # The webhook's view sidecar: root with the owner's gid, privileged,
        # read-only root, the view's volume Bidirectional.
        log = self.runner.start("sidecar-view", self.runner.privileged_spec(
            ["granary-sidecar", "--config=/etc/granary/config/sidecar-view.yaml",
             f"--local-node={NODE_ID}"], uid=0, gid=OWNER,
            mounts=[(run, "/run/granary", False),
                    (p["node-socket"], "/run/granary-node", True),
                    (p["config"], "/etc/granary/config", True),
                    (os.path.join(p["key"], "root"), "/etc/granary/cluster-key", True),
                    (view, "/mnt/granary", False, "rshared")]))
        self.wait_ready("sidecar-view", metrics, log)
        target = os.path.join(view, "tiny")
        deadline = time.monotonic() + 20
        while not any(line.split()[4] == target and " - fuse" in line
                      for line in open("/proc/self/mountinfo")):
            if time.monotonic() > deadline:
                raise Failure(f"the view did not reach the host's {target} (Bidirectional "
                              f"propagation); the sidecar's log ends:\n{tail(log)}")
            time.sleep(0.1)
        # The trainer: unmodified code reading files by path, and the image's
        # Python package importing its native module.
        script = ("import hashlib, json, os, sys, granary, granary._native\n"
                  "out = {}\n"
                  "for d, _, fs in os.walk('/data/tiny'):\n"
                  "    for f in fs:\n"
                  "        path = os.path.join(d, f)\n"
                  "        with open(path, 'rb') as fh:\n"
                  "            out[os.path.relpath(path, '/data/tiny')] = "
                  "hashlib.sha256(fh.read()).hexdigest()\n"
                  "json.dump(out, sys.stdout)\n")
        code, out, err = self.runner.run("trainer", self.runner.spec(
            ["python3", "-c", script], uid=OWNER, gid=OWNER, caps=(),
            mounts=[(view, "/data", True, "rslave")]))
        if code != 0:
            raise Failure(f"the trainer exited {code}: {err}\nsidecar log:\n{tail(log)}")
        got = json.loads(out)
        want = {k: hashlib.sha256(v).hexdigest() for k, v in self.samples.items()}
        if got != want:
            missing = sorted(set(want) - set(got))[:5]
            wrong = sorted(k for k in want if k in got and got[k] != want[k])[:5]
            raise Failure(f"the view served {len(got)} files; missing {missing}, wrong {wrong}")
        if not self.runner.stop("sidecar-view", timeout=15):
            raise Failure("the view sidecar did not stop within 15 s of SIGTERM")
        if any(line.split()[4] == target for line in open("/proc/self/mountinfo")):
            raise Failure(f"the view is still mounted at {target} after its sidecar stopped")
        say(f"     {len(got)} files read by path through the view, byte-exact; "
            "unmounted when the sidecar stopped")

    def daemons_stop(self):
        for cid in ("sidecar", "cachenode"):
            t0 = time.monotonic()
            if not self.runner.stop(cid, timeout=15):
                raise Failure(f"{cid} did not stop within 15 s of SIGTERM")
            say(f"     {cid} stopped {time.monotonic() - t0:.1f} s after SIGTERM")


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def tail(path, n=3000):
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode("utf-8", "replace")
    except OSError:
        return "(no log)"


def archive_image_name(path):
    """The image name an OCI archive carries (index.json's annotations):
    scripts/image/oci-archive writes containerd's name; buildah and podman
    (`push ... oci-archive:FILE:NAME`) only the OCI ref.name, which ctr imports
    as the image's name when it is a whole reference."""
    with tarfile.open(path) as t:
        index = json.load(t.extractfile("index.json"))
    annotations = index["manifests"][0].get("annotations", {})
    return (annotations.get("io.containerd.image.name") or
            annotations.get("org.opencontainers.image.ref.name"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--image", help="an OCI archive made before (default: assemble one)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    # SIGTERM (ctest, Ctrl-C's cousin) unwinds like a failure: teardown runs.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    why = skip_reason()
    if why:
        say(f"SKIPPED: container_image_test: {why}")
        return SKIP
    return Test(args).main()


if __name__ == "__main__":
    sys.exit(main())
