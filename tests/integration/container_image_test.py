#!/usr/bin/python3
"""Granary's images under containerd and runc, each container as the chart runs it.

A private containerd (its own root, state and socket in a temporary directory,
the CRI plugin off) imports the three images the real-node tests use, made from
the build under test by scripts/image/assemble (granary, and with --trainer
granary-trainer) and scripts/image/redis (granary.local/redis), and runs, through `ctr run` with an OCI spec written here
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
  trainer    the trainer image as uid 65532, no capabilities, read-only root:
             imports torch and granary and reads two epochs through the
             sidecar with granary.torch and a DataLoader, byte-exact.
  redis      the Redis image as the chart's redis and sentinel pods (uid/gid
             999, no capabilities, read-only root) with the chart's rendered
             redis.conf (helm template): PING only with AUTH, the AOF in /data;
             files/redis-start.sh and files/sentinel-start.sh start a primary
             and a sentinel that sees it up with the password.

Bad command lines of the image scripts are refused with a reason.

The metadata store is a redis-server of the test's on 127.0.0.1 (host network).
Everything is removed at the end, also on failure: tasks, containers, the image
mount and snapshots, containerd, redis and the directory (check-test-leftovers
looks for granary-test-*). Skips (exit 77) saying why where it cannot run: not
root, no containerd, runc or redis-server, no overlay file system.

  tests/integration/container_image_test.py --source-dir . --build-dir build/release
      [--image ARCHIVE] [--trainer-image ARCHIVE] [--redis-image ARCHIVE]
      # archives made before (else made here)
"""
import argparse
import base64
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
REDIS_UID = 999  # the chart's Redis securityContext (runAsUser, runAsGroup, fsGroup)

# What a training Job runs in the trainer image: granary.torch's ImageFolder and
# DistributedSampler under a DataLoader with worker processes, two epochs; prints
# each epoch's (path, class, SHA-256) in the order read, as JSON on its last line.
TRAINER = """
import hashlib, json, torch, granary
from granary.torch import DistributedSampler, ImageFolder, bytes_loader
ds = ImageFolder("tiny", loader=bytes_loader, is_valid_file=lambda p: p.endswith(".bin"))
sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2,
                                     collate_fn=list)
epochs = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    items = [item for batch in loader for item in batch]
    order = sampler.indices(epoch)
    epochs.append([[ds.samples[i][0], target, hashlib.sha256(data).hexdigest()]
                   for i, (data, target) in zip(order, items)])
    assert len(order) == len(items), (len(order), len(items))
print(json.dumps({"torch": torch.__version__, "classes": ds.classes, "epochs": epochs}))
"""


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

    def __init__(self, containerd, work, image, rootfs="rootfs"):
        self.c = containerd
        self.work = work
        self.image = image
        self.rootfs = os.path.join(work, rootfs)
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
             seccomp=True, cwd="/var/lib/granary"):
        s = json.loads(json.dumps(self.default))
        s["root"] = {"path": self.rootfs, "readonly": True}  # readOnlyRootFilesystem
        p = s["process"]
        p["args"] = list(args)
        p["env"] = list(self.image_env) + list(env)
        p["cwd"] = cwd
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

    def exec(self, cid, args, timeout=30):
        """A process in a running container, as the kubelet runs an exec probe
        (the container's user and environment); returns (exit code, stdout, stderr)."""
        self.exec_count = getattr(self, "exec_count", 0) + 1
        r = self.c.ctr("tasks", "exec", "--exec-id", f"exec-{self.exec_count}", cid, *args,
                       check=False, timeout=timeout)
        return (r.returncode, r.stdout.decode(errors="replace"),
                r.stderr.decode(errors="replace"))

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
        self.runners = []  # one per image, each with its view of the image mounted
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

    def archive(self, given, what, script_args):
        """An image archive: the one given, or one the image scripts make now."""
        t0 = time.monotonic()
        path = given
        if path is None:
            path = os.path.join(self.work, f"{what}.oci.tar")
            r = subprocess.run([os.path.join(self.source_dir, "scripts/image", script_args[0]),
                                *script_args[1:], "--output", path],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
            if r.returncode != 0:
                raise Failure(f"scripts/image/{' '.join(script_args)} exited {r.returncode}:\n"
                              f"{r.stdout.decode(errors='replace')[-3000:]}")
        name = archive_image_name(path)
        say(f"{what} image {name}: {path}, {os.path.getsize(path) / 2**20:.1f} MiB "
            f"({time.monotonic() - t0:.1f} s)")
        return path, name

    def import_image(self, path, name, rootfs):
        t0 = time.monotonic()
        self.containerd.ctr("images", "import", path, timeout=600)
        say(f"imported {name} into a private containerd ({time.monotonic() - t0:.1f} s)")
        runner = ImageRunner(self.containerd, self.work, name, rootfs)
        self.runners.append(runner)
        runner.prepare()
        return runner

    def setup(self):
        build = ["--build-dir", self.build_dir]
        images = [self.archive(self.args.image, "granary", ["assemble", *build]),
                  self.archive(self.args.trainer_image, "trainer",
                               ["assemble", "--trainer", *build]),
                  self.archive(self.args.redis_image, "redis", ["redis"])]
        self.image_name = images[0][1]
        self.containerd.start()
        self.runner = self.import_image(*images[0], "rootfs")
        self.trainer = self.import_image(*images[1], "rootfs-trainer")
        self.redis_image = self.import_image(*images[2], "rootfs-redis")

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
        for runner in self.runners:
            runner.teardown()
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
        self.case("image scripts refuse bad inputs, saying what to do", self.bad_inputs)
        self.granary_cases()
        self.redis_cases()

    def bad_inputs(self):
        image = os.path.join(self.source_dir, "scripts/image")
        empty = os.path.join(self.work, "empty-build")
        os.makedirs(empty)
        missing = os.path.join(self.work, "no-such-build")
        cases = [
            (["assemble", "--build-dir", missing], 2, f"--build-dir {missing}: no such directory"),
            (["assemble", "--trainer", "--build-dir", missing], 2, "no such directory"),
            (["assemble", "--build-dir"], 2, "--build-dir needs a value"),
            (["assemble", "--bogus"], 2, "unknown argument --bogus"),
            (["assemble", "--build-dir", empty], 1,
             f"{empty}/operator/granary-operator is missing: build it first"),
            (["redis", "--bogus"], 2, "unknown argument --bogus"),
            (["test-images", "--address", missing], 2, f"--address {missing} is not a socket"),
            (["runtime-layer", "--user", "redis:x:999:/data", "redis-server"], 2,
             "is not NAME:UID:GID:HOME"),
        ]
        for argv, want_code, want_text in cases:
            r = subprocess.run([os.path.join(image, argv[0]), *argv[1:]], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, check=False, timeout=60)
            err = r.stderr.decode(errors="replace")
            if r.returncode != want_code or want_text not in err or r.stdout:
                raise Failure(f"scripts/image/{' '.join(argv)} exited {r.returncode} (not "
                              f"{want_code}) saying {err.strip()[:300]!r}, stdout "
                              f"{r.stdout[:100]!r}; wanted {want_text!r}")
        say(f"     {len(cases)} bad command lines refused, each saying why")

    def granary_cases(self):
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
        self.case("trainer image (uid 65532, read-only root, no capabilities): import torch, "
                  "granary; two epochs through granary.torch and a DataLoader with 2 workers "
                  "via the sidecar, byte-exact", self.trainer_reads)
        if os.path.exists("/dev/fuse"):
            self.case("POSIX view: a privileged sidecar mounts it, a trainer (uid 65532, "
                      "no capabilities) reads every file by path byte-exact", self.posix_view)
        else:
            say("     no /dev/fuse on this host: the POSIX view case is not run")
        self.case("cachenode and sidecar stop on SIGTERM", self.daemons_stop)

    def redis_cases(self):
        self.case("redis image (uid/gid 999, read-only root, no capabilities): the chart's "
                  "redis.conf, PING answered only with AUTH, the AOF in /data", self.redis_auth)
        self.case("redis image with Sentinel: the chart's redis-start.sh starts a primary, "
                  "sentinel-start.sh a sentinel that names it", self.redis_sentinel)

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

    def trainer_reads(self):
        """A training Job's container: the trainer image as the Dataset's runAs uid, the
        injected sidecar's socket mounted, granary.torch over the dataset."""
        mounts = [(self.paths["sidecar-run"], "/run/granary", True)]
        env = ["GRANARY_SOCKET=/run/granary/sidecar.sock"]

        def spec(args):
            return self.trainer.spec(args, uid=OWNER, gid=OWNER, caps=(), mounts=mounts,
                                     env=env)

        code, out, err = self.trainer.run("trainer-probe", spec(security_probe()))
        if code != 0:
            raise Failure(f"the probe exited {code}: {err}")
        check_probe(out, OWNER, OWNER, "0000000000000000")
        code, out, err = self.trainer.run("trainer-torch", spec(["python3", "-c", TRAINER]),
                                          timeout=300)
        if code != 0:
            raise Failure(f"the trainer exited {code}: {out}{err}\nsidecar log:\n"
                          f"{tail(self.sidecar_log)}")
        got = json.loads(out.strip().splitlines()[-1])
        want_classes = sorted({k.split("/")[0] for k in self.samples})
        if got["classes"] != want_classes:
            raise Failure(f"ImageFolder's classes {got['classes']}, not {want_classes}")
        orders = []
        for epoch, items in enumerate(got["epochs"]):
            paths = [path for path, _, _ in items]
            if sorted(paths) != sorted(f"tiny/{k}" for k in self.samples):
                raise Failure(f"epoch {epoch} read {len(paths)} samples ({len(set(paths))} "
                              f"distinct), not each of the {len(self.samples)} once")
            for path, target, digest in items:
                rel = path[len("tiny/"):]
                if digest != hashlib.sha256(self.samples[rel]).hexdigest():
                    raise Failure(f"epoch {epoch}: {path}'s bytes are not the source's")
                if target != want_classes.index(rel.split("/")[0]):
                    raise Failure(f"epoch {epoch}: {path} has class {target}")
            orders.append(paths)
        if len(orders) != 2 or orders[0] == orders[1]:
            raise Failure(f"{len(orders)} epochs, the same order each time: set_epoch did not "
                          "reshuffle")
        say(f"     torch {got['torch']}: 2 epochs of {len(orders[0])} samples, shuffled "
            "differently, byte-exact")

    def chart_redis_secret(self, *sets):
        """(password, redis.conf) as the chart's Secret <fullname>-redis holds them, from
        `helm template` of charts/granary with the given --set values."""
        helm = find_helm(self.source_dir)
        if helm is None:
            raise Failure("no helm to render the chart's redis.conf: run scripts/k8s-tools "
                          "(or set GRANARY_K8S_BIN to its directory)")
        try:
            import yaml  # pylint: disable=import-outside-toplevel
        except ImportError:
            raise Failure("python3 lacks PyYAML (python3-yaml); run scripts/install-deps") \
                from None
        argv = [helm, "template", "t", os.path.join(self.source_dir, "charts/granary"),
                "--namespace", "granary", "--kube-version", "1.37.2",
                "--show-only", "templates/redis-secret.yaml"]
        for s in sets:
            argv += ["--set", s]
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
        if r.returncode != 0:
            raise Failure(f"helm template exited {r.returncode}: {r.stderr.decode()}")
        for doc in yaml.safe_load_all(r.stdout):
            if doc and "redis.conf" in doc.get("data", {}):
                data = doc["data"]
                return (base64.b64decode(data["password"]).decode(),
                        base64.b64decode(data["redis.conf"]))
        raise Failure("helm template rendered no Secret with redis.conf")

    def redis_volumes(self, name, conf=None, password=None):
        """Host directories as the kubelet makes the chart's volumes for uid/gid 999 with
        fsGroup 999: the Secret's files 0440 group 999, emptyDirs 0777."""
        d = os.path.join(self.work, name)
        paths = {}
        for vol in ("config", "data", "tmp", "run"):
            paths[vol] = os.path.join(d, vol)
            os.makedirs(paths[vol])
            os.chmod(paths[vol], 0o777)
        os.chmod(paths["config"], 0o755)
        for file, content in (("redis.conf", conf), ("password", password)):
            if content is not None:
                path = os.path.join(paths["config"], file)
                with open(path, "wb") as f:
                    f.write(content if isinstance(content, bytes) else content.encode())
                os.chown(path, 0, REDIS_UID)
                os.chmod(path, 0o440)
        return paths

    def redis_spec(self, args, mounts, env, host_network):
        return self.redis_image.spec(args, uid=REDIS_UID, gid=REDIS_UID, caps=(),
                                     host_network=host_network, mounts=mounts, env=env,
                                     cwd="/data")

    def wait_exec(self, cid, args, log, timeout=30):
        """Runs an exec probe until it exits 0 (the kubelet's readiness); its last output."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.redis_image.alive(cid):
                raise Failure(f"{cid} exited; its log ends:\n{tail(log)}")
            code, out, err = self.redis_image.exec(cid, args)
            if code == 0:
                return out
            if time.monotonic() > deadline:
                raise Failure(f"{' '.join(args)} in {cid} still exits {code} after {timeout} s "
                              f"({out}{err}); its log ends:\n{tail(log)}")
            time.sleep(0.2)

    def redis_auth(self):
        password, conf = self.chart_redis_secret()
        if f"requirepass {password}".encode() not in conf:
            raise Failure(f"the chart's redis.conf has no requirepass:\n{conf.decode()}")
        v = self.redis_volumes("redis", conf=conf)
        # The redis container as the StatefulSet has it (no sentinel): its own network
        # namespace, so the conf's port 6379 is its own.
        mounts = [(v["data"], "/data", False), (v["config"], "/etc/redis", True),
                  (v["tmp"], "/tmp", False)]
        env = [f"REDISCLI_AUTH={password}"]
        spec = self.redis_spec(security_probe(), mounts, env, host_network=False)
        code, out, err = self.redis_image.run("redis-probe", spec)
        if code != 0:
            raise Failure(f"the probe exited {code}: {err}")
        check_probe(out, REDIS_UID, REDIS_UID, "0000000000000000")
        log = self.redis_image.start("redis", self.redis_spec(
            ["redis-server", "/etc/redis/redis.conf"], mounts, env, host_network=False))
        # The chart's readiness probe, as the kubelet runs it.
        self.wait_exec("redis", ["sh", "-c", "redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG"],
                       log)
        code, out, err = self.redis_image.exec("redis", [
            "sh", "-c", "env -u REDISCLI_AUTH redis-cli -h 127.0.0.1 -p 6379 ping"])
        if "NOAUTH" not in out + err:
            raise Failure(f"PING without the password answered {out.strip()!r} {err.strip()!r}, "
                          "not NOAUTH")
        code, out, err = self.redis_image.exec("redis", [
            "redis-cli", "-h", "127.0.0.1", "-p", "6379", "set", "granary:probe", "1"])
        if code != 0 or out.strip() != "OK":
            raise Failure(f"SET with AUTH exited {code}: {out}{err}")
        deadline = time.monotonic() + 10
        aof = os.path.join(v["data"], "appendonlydir")
        while not (os.path.isdir(aof) and os.listdir(aof)):
            if time.monotonic() > deadline:
                raise Failure(f"no AOF in /data ({os.listdir(v['data'])}); the log ends:\n"
                              f"{tail(log)}")
            time.sleep(0.1)
        owners = {os.stat(os.path.join(aof, f)).st_uid for f in os.listdir(aof)}
        if owners != {REDIS_UID}:
            raise Failure(f"the AOF's files are owned by {owners}, not uid {REDIS_UID}")
        if not self.redis_image.stop("redis", timeout=15):
            raise Failure("redis-server did not stop within 15 s of SIGTERM")
        say(f"     {tail(log, 400).strip().splitlines()[-1]}")

    def redis_sentinel(self):
        password, conf = self.chart_redis_secret(
            "redis.sentinel.enabled=true", "redis.replicas=2", "redis.persistence.enabled=true")
        if f"masterauth {password}".encode() not in conf:
            raise Failure(f"the chart's Sentinel redis.conf has no masterauth:\n{conf.decode()}")
        scripts = os.path.join(self.source_dir, "charts/granary/files")
        # Both on the host's network (one loopback for the two pods' names), on free ports.
        port, sport = free_port(), free_port()
        common = {"MASTER_NAME": "granary", "SELF_HOST": "127.0.0.1",
                  "FIRST_PRIMARY": f"127.0.0.1:{port}", "SENTINELS": f"127.0.0.1:{sport}"}
        v = self.redis_volumes("redis-sentinel-data", conf=conf)
        # The kubelet's /etc/hosts (sentinel-start.sh waits until the primary resolves).
        hosts = os.path.join(self.work, "redis-hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        env = {**common, "REDISCLI_AUTH": password, "SELF_IP": "127.0.0.1",
               "BASE_CONF": "/etc/redis/redis.conf", "RUN_DIR": "/run/redis",
               "REDIS_PORT": str(port)}
        log = self.redis_image.start("redis-primary", self.redis_spec(
            ["sh", "/scripts/redis-start.sh"],
            [(v["data"], "/data", False), (v["config"], "/etc/redis", True),
             (v["tmp"], "/tmp", False), (scripts, "/scripts", True),
             (v["run"], "/run/redis", False), (hosts, "/etc/hosts", True)],
            [f"{k}={val}" for k, val in env.items()], host_network=True))
        self.wait_exec("redis-primary", [
            "sh", "-c", f"redis-cli -h 127.0.0.1 -p {port} ping | grep -q PONG"], log)
        if "starting 127.0.0.1 as the primary" not in tail(log):
            raise Failure(f"redis-start.sh did not start it as the primary:\n{tail(log)}")
        s = self.redis_volumes("redis-sentinel", password=password)
        env = {**common, "RUN_DIR": "/run/sentinel", "SENTINEL_PORT": str(sport),
               "SENTINEL_BIND": "127.0.0.1", "QUORUM": "1", "DOWN_AFTER_MS": "1000",
               "FAILOVER_TIMEOUT_MS": "30000", "PARALLEL_SYNCS": "1",
               "PASSWORD_FILE": "/etc/redis/password", "RESOLVE_WAIT_SECONDS": "10"}
        slog = self.redis_image.start("redis-sentinel", self.redis_spec(
            ["sh", "/scripts/sentinel-start.sh"],
            [(scripts, "/scripts", True), (s["config"], "/etc/redis", True),
             (s["run"], "/run/sentinel", False), (hosts, "/etc/hosts", True)],
            [f"{k}={val}" for k, val in env.items()], host_network=True))
        # The chart's sentinel readiness probe (on this sentinel's port), then its answer.
        out = self.wait_exec("redis-sentinel", [
            "sh", "-c", f'redis-cli -p {sport} sentinel get-master-addr-by-name "$MASTER_NAME" '
            '| grep .'], slog)
        if out.split() != ["127.0.0.1", str(port)]:
            raise Failure(f"the sentinel names {out.split()} as the primary, not "
                          f"127.0.0.1:{port}")
        # A sentinel that cannot AUTH (auth-pass from the password file) gets NOAUTH to
        # its PINGs and counts the primary down (s_down) after DOWN_AFTER_MS (1 s).
        time.sleep(2.5)
        code, out, err = self.redis_image.exec("redis-sentinel", [
            "redis-cli", "-p", str(sport), "sentinel", "master", "granary"])
        fields = out.splitlines()  # a name, its value, ... (a value may be empty)
        master = dict(zip(fields[0::2], fields[1::2]))
        if code != 0 or master.get("flags") != "master" or \
                int(master.get("last-ok-ping-reply", "1000000")) > 1500:
            raise Failure(f"the sentinel sees the primary with flags {master.get('flags')!r}, "
                          f"last ok PING {master.get('last-ok-ping-reply')} ms ago ({out}{err}); "
                          f"its log ends:\n{tail(slog)}")
        flags = master["flags"]
        for cid in ("redis-sentinel", "redis-primary"):
            if not self.redis_image.stop(cid, timeout=15):
                raise Failure(f"{cid} did not stop within 15 s of SIGTERM")
        say(f"     the sentinel on :{sport} names the primary 127.0.0.1:{port}, flags {flags}")

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


def find_helm(source_dir):
    """helm from the Kubernetes test tools (GRANARY_K8S_BIN, or scripts/k8s-tools
    --no-build), else the PATH's."""
    candidates = []
    if os.environ.get("GRANARY_K8S_BIN"):
        candidates.append(os.path.join(os.environ["GRANARY_K8S_BIN"], "helm"))
    r = subprocess.run([os.path.join(source_dir, "scripts/k8s-tools"), "--no-build"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)
    if r.returncode == 0 and r.stdout.strip():
        candidates.append(os.path.join(r.stdout.decode().strip(), "helm"))
    candidates.append(shutil.which("helm") or "")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


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
    ap.add_argument("--trainer-image", help="the trainer image's archive made before "
                    "(default: scripts/image/assemble --trainer)")
    ap.add_argument("--redis-image", help="the Redis image's archive made before "
                    "(default: scripts/image/redis)")
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
