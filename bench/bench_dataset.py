"""The benchmark's dataset (BENCHMARK.md, "Workload"): an ImageNet-like tree.

Class folders of 100 files named like ImageNet's (``n00000007/n00000007_0000712.JPEG``),
incompressible bytes from ``random.Random(seed)``, sizes log-normal with mean
110 KiB (sigma 0.5, clamped to 1 KiB..4 MiB). The same (files, seed) gives the
same tree, byte for byte. ``generate`` returns the index the trainer checks
deliveries against: every file's path relative to the root, in sorted order
(Granary's sample ids), with its size and CRC-32.

Library use: ``generate(root, files, seed)``, ``save_index``/``load_index``.
Command line (with /usr/bin/python3):
    bench/bench_dataset.py --files N [--seed S] [--index FILE] DIR
"""

import argparse
import json
import math
import os
import random
import sys
import zlib

MEAN_SIZE = 110 * 1024
SIGMA = 0.5
MIN_SIZE = 1024
MAX_SIZE = 4 << 20
FILES_PER_CLASS = 100


def generate(root, files, seed, progress=None):
    """Writes `files` files under `root` (an empty or new directory); returns the index."""
    if files < 1:
        raise ValueError(f"the dataset needs at least 1 file, not {files}")
    os.makedirs(root, exist_ok=True)
    if os.listdir(root):
        raise ValueError(f"{root!r} is not empty; the generator writes into an empty directory")
    rng = random.Random(seed)
    mu = math.log(MEAN_SIZE) - SIGMA * SIGMA / 2  # so that the mean is MEAN_SIZE
    classes = max(1, (files + FILES_PER_CLASS - 1) // FILES_PER_CLASS)
    entries = []
    for i in range(files):
        cls = f"n{i % classes:08d}"
        if i < classes:
            os.mkdir(os.path.join(root, cls))
        rel = f"{cls}/{cls}_{i:07d}.JPEG"
        size = min(MAX_SIZE, max(MIN_SIZE, int(rng.lognormvariate(mu, SIGMA))))
        data = rng.randbytes(size)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        entries.append((rel, size, zlib.crc32(data)))
        if progress is not None and (i + 1) % 5000 == 0:
            progress(i + 1)
    # Sample ids are the sorted order of the paths (the manifest's order); paths
    # are ASCII, so str order is byte order.
    entries.sort()
    return {"files": files, "seed": seed, "bytes": sum(e[1] for e in entries),
            "paths": [e[0] for e in entries], "sizes": [e[1] for e in entries],
            "crc32": [e[2] for e in entries]}


def save_index(index, path):
    with open(path, "w") as f:
        json.dump(index, f)


def load_index(path):
    with open(path) as f:
        index = json.load(f)
    n = len(index["paths"])
    if not (len(index["sizes"]) == len(index["crc32"]) == n == index["files"]):
        raise ValueError(f"{path}: the index's lists disagree in length")
    return index


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="an empty or new directory")
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--index", help="write the index (paths, sizes, CRC-32) there as JSON")
    args = ap.parse_args()
    try:
        index = generate(args.dir, args.files, args.seed)
    except (ValueError, OSError) as e:
        sys.exit(f"bench_dataset: {e}")
    if args.index:
        save_index(index, args.index)
    print(f"{index['files']} files, {index['bytes']} bytes in {args.dir}")


if __name__ == "__main__":
    main()
