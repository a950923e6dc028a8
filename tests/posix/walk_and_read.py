"""Unmodified training-style reads over a granary mount (posix_mount_test).

    walk_and_read.py MOUNT REFERENCE_DIR

REFERENCE_DIR holds the expected files (written by the test from the
snapshot's bytes, not the source). Checks, printing one line per failure:
  1. os.walk + open().read() of every file equals it byte for byte, and
     os.walk sees exactly those files;
  2. a torchvision-style ImageFolder with a loader returning raw bytes:
     torchvision's own when it can be imported, else the same rules
     (classes = sorted subdirectories of the root; per class sorted os.walk
     with followlinks, sorted file names; files at the root skipped);
     every sample's bytes and class index are checked;
  3. os.stat of every file (st_size) without reading.
Exits 0 when everything matched; prints "N files ok" last.
"""
import hashlib
import os
import sys


def main():
    mount, reference = sys.argv[1], sys.argv[2]
    expected = {}
    for dirpath, _, filenames in os.walk(reference):
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                data = f.read()
            expected[os.path.relpath(full, reference)] = {
                "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    failures = []

    seen = {}
    for dirpath, dirnames, filenames in os.walk(mount):
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, mount)
            with open(full, "rb") as f:
                data = f.read()
            seen[rel] = data
    if set(seen) != set(expected):
        failures.append("os.walk saw %d files, expected %d; missing %s, extra %s" % (
            len(seen), len(expected), sorted(set(expected) - set(seen))[:5],
            sorted(set(seen) - set(expected))[:5]))
    for rel, want in expected.items():
        data = seen.get(rel)
        if data is None:
            continue
        if len(data) != want["size"] or hashlib.sha256(data).hexdigest() != want["sha256"]:
            failures.append("bytes of %s differ (%d bytes read, %d expected)" % (
                rel, len(data), want["size"]))

    def raw_loader(path):
        with open(path, "rb") as f:
            return f.read()

    try:
        from torchvision.datasets import ImageFolder  # noqa: F401
        folder = ImageFolder(mount, loader=raw_loader, is_valid_file=lambda p: True)
        samples = folder.samples
        classes = folder.classes
        how = "torchvision.datasets.ImageFolder"
    except ImportError:
        classes = sorted(e.name for e in os.scandir(mount) if e.is_dir())
        samples = []
        for index, cls in enumerate(classes):
            for root, _, fnames in sorted(os.walk(os.path.join(mount, cls), followlinks=True)):
                for fname in sorted(fnames):
                    samples.append((os.path.join(root, fname), index))
        how = "ImageFolder's rules"
    want_classes = sorted({rel.split("/")[0] for rel in expected if "/" in rel})
    if classes != want_classes:
        failures.append("%s classes %s, expected %s" % (how, classes, want_classes))
    in_classes = sorted(rel for rel in expected if "/" in rel)
    got_paths = sorted(os.path.relpath(p, mount) for p, _ in samples)
    if got_paths != in_classes:
        failures.append("%s has %d samples, expected %d" % (how, len(got_paths), len(in_classes)))
    for path, index in samples:
        rel = os.path.relpath(path, mount)
        data = raw_loader(path)
        if classes[index] != rel.split("/")[0]:
            failures.append("%s: class %d for %s" % (how, index, rel))
        want = expected.get(rel)
        if want is None or hashlib.sha256(data).hexdigest() != want["sha256"]:
            failures.append("%s: bytes of %s differ" % (how, rel))

    for rel, want in expected.items():
        st = os.stat(os.path.join(mount, rel))
        if st.st_size != want["size"]:
            failures.append("stat %s: size %d, expected %d" % (rel, st.st_size, want["size"]))

    for line in failures[:50]:
        print("FAIL " + line)
    if failures:
        print("%d failures" % len(failures))
        return 1
    print("%s: %d files ok (%d samples in %d classes)" % (how, len(expected), len(samples),
                                                         len(classes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
