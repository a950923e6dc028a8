"""Across the ranks' outputs of dataloader_epochs.py: every epoch reads every
sample once across ranks (plus DistributedSampler's padding repeats), and the
ranks' shares have the sizes torch's sampler gives them."""

import argparse
from collections import Counter

from granary_test_util import check, read_json


def main():
    p = argparse.ArgumentParser()
    p.add_argument("outputs", nargs="+")
    a = p.parse_args()
    runs = [read_json(path) for path in a.outputs]
    world = runs[0]["world_size"]
    check(sorted(r["rank"] for r in runs) == list(range(world)),
          f"outputs are of ranks {[r['rank'] for r in runs]}, world size {world}")
    n = runs[0]["n"]
    total = runs[0]["total_size"]
    epochs = len(runs[0]["epochs"])
    for epoch in range(epochs):
        all_ids = []
        for r in runs:
            ids = r["epochs"][epoch]
            check(len(ids) == r["num_samples"], f"epoch {epoch} rank {r['rank']}: {len(ids)} "
                  f"samples, share {r['num_samples']}")
            check(-1 not in ids, f"epoch {epoch} rank {r['rank']}: bytes of no source file")
            all_ids += ids
        counts = Counter(all_ids)
        missing = sorted(set(range(n)) - set(counts))
        check(not missing, f"epoch {epoch}: {len(missing)} samples read by no rank, e.g. "
              f"{missing[:5]}")
        check(len(all_ids) == total, f"epoch {epoch}: {len(all_ids)} reads, total_size {total}")
        repeats = sum(c - 1 for c in counts.values())
        check(repeats == total - n, f"epoch {epoch}: {repeats} repeated reads, padding is "
              f"{total - n}")
    print(f"{world} ranks, {epochs} epochs: every sample once per epoch (n={n}, "
          f"total_size={total})")


if __name__ == "__main__":
    main()
