"""One rank reading epochs through DataLoader + granary.torch.DistributedSampler.

Checks, per epoch: the rank gets exactly num_samples samples, in the
sampler's order (granary's plan code), each byte-equal to its source file.
Writes the ids it read per epoch to --out for check_union.py.
"""

import argparse
import multiprocessing

import torch.utils.data

import granary
from granary.torch import DistributedSampler
from granary_test_util import check, collate_list, id_of_bytes, read_source, write_json


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--start-method", default=None, choices=[None, "fork", "spawn"])
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    ds = granary.Dataset(a.dataset)
    source = read_source(a.source_root, ds.paths())
    id_of = id_of_bytes(source)
    sampler = DistributedSampler(ds, num_replicas=a.world_size, rank=a.rank, shuffle=True,
                                 seed=a.seed)
    context = None
    if a.num_workers > 0 and a.start_method is not None:
        context = multiprocessing.get_context(a.start_method)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=a.batch_size, sampler=sampler, num_workers=a.num_workers,
        collate_fn=collate_list, multiprocessing_context=context,
        persistent_workers=a.persistent_workers)

    epochs = []
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        expected = granary.rank_samples(len(ds), a.seed, epoch, a.world_size, a.rank, True,
                                        False)
        check(list(sampler.indices()) == expected, f"epoch {epoch}: sampler.indices() is not "
              f"granary.rank_samples(...)")
        got = [data for batch in loader for data in batch]
        check(len(got) == sampler.num_samples == len(expected),
              f"epoch {epoch}: rank {a.rank} read {len(got)} samples, its share is "
              f"{sampler.num_samples}")
        ids = [id_of.get(data, -1) for data in got]
        wrong = [k for k in range(len(got)) if got[k] != source[expected[k]]]
        check(not wrong, f"epoch {epoch}: {len(wrong)} of {len(got)} samples are not the "
              f"sampler's sample's source bytes; first at position {wrong[0] if wrong else 0}: "
              f"read id {ids[wrong[0]] if wrong else 0}, sampler said "
              f"{expected[wrong[0]] if wrong else 0}")
        check(len(loader) == (sampler.num_samples + a.batch_size - 1) // a.batch_size,
              "len(loader)")
        epochs.append(ids)
    if a.epochs > 1:
        check(epochs[0] != epochs[1], "two epochs read the same order (set_epoch ignored?)")
    write_json(a.out, {"rank": a.rank, "world_size": a.world_size, "n": len(ds),
                       "num_samples": sampler.num_samples, "total_size": sampler.total_size,
                       "epochs": epochs})
    print(f"rank {a.rank}: {a.epochs} epochs of {sampler.num_samples} samples ok "
          f"(workers={a.num_workers}, start={a.start_method}, "
          f"persistent={a.persistent_workers})")


if __name__ == "__main__":
    main()
