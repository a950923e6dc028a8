"""Resuming mid-epoch with torchdata's StatefulDataLoader over granary.torch.

--phase first: a StatefulDataLoader (--num-workers workers, batches of
--batch-size) over a granary.Dataset with granary's DistributedSampler reads
epoch 0 whole, then --stop-after batches of epoch 1, saves
loader.state_dict() with torch.save and the ids read to --state, and exits
mid-epoch (as a preempted job would).
--phase second: a new process builds the same loader and sampler, loads the
state with loader.load_state_dict and reads on: exactly the rest of epoch 1, in
the sampler's order, each sample's bytes the source file's; the next epoch is
whole again. A loader built before the training loop's set_epoch() reads the
epoch that was set.
Exits 77 (a skip) when torchdata's StatefulDataLoader cannot be imported.
"""

import argparse
import sys

try:
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError as e:
    print(f"skipped: torchdata.stateful_dataloader.StatefulDataLoader cannot be imported ({e}); "
          f"the torch 2.x venv (client/python/requirements/torch2.txt) has it")
    sys.exit(77)

import granary
from granary.torch import DistributedSampler
from granary_test_util import check, collate_list, id_of_bytes, read_json, read_source, write_json


def make(a, ds):
    sampler = DistributedSampler(ds, num_replicas=a.world_size, rank=a.rank, shuffle=True,
                                 seed=a.seed)
    loader = StatefulDataLoader(ds, batch_size=a.batch_size, sampler=sampler,
                                num_workers=a.num_workers, collate_fn=collate_list)
    return sampler, loader


def ids_of(batch, id_of):
    ids = [id_of.get(data, -1) for data in batch]
    check(-1 not in ids, "a sample's bytes are no source file's")
    return ids


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phase", required=True, choices=["first", "second"])
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--state", required=True, help="where the first phase saves its state")
    p.add_argument("--num-workers", type=int, required=True)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--stop-after", type=int, default=6)
    a = p.parse_args()

    ds = granary.Dataset(a.dataset)
    id_of = id_of_bytes(read_source(a.source_root, ds.paths()))
    sampler, loader = make(a, ds)
    epoch = 1

    if a.phase == "first":
        whole = [i for batch in loader for i in ids_of(batch, id_of)]
        check(whole == sampler.indices(0), "epoch 0 through the StatefulDataLoader is not the "
                                           "sampler's order")
        sampler.set_epoch(epoch)
        ids = []
        for n, batch in enumerate(loader):
            ids += ids_of(batch, id_of)
            if n + 1 == a.stop_after:
                break
        check(len(ids) == a.stop_after * a.batch_size,
              f"read {len(ids)} samples in {a.stop_after} batches")
        torch.save(loader.state_dict(), a.state + ".pt")
        write_json(a.state, {"ids": ids})
        print(f"first run, {a.num_workers} workers: epoch 0 whole, stopped after {len(ids)} "
              f"samples of epoch {epoch}")
        return

    saved = read_json(a.state)["ids"]
    loader.load_state_dict(torch.load(a.state + ".pt"))
    rest = [i for batch in loader for i in ids_of(batch, id_of)]
    expected = sampler.indices(epoch)
    check(sampler.epoch == epoch, f"the sampler's epoch after the load is {sampler.epoch}")
    check(saved + rest == expected,
          f"first run ({len(saved)}) + resumed run ({len(rest)}) is not the rank's share of "
          f"{len(expected)} in order; resumed run starts {rest[:5]}, expected "
          f"{expected[len(saved):len(saved) + 5]}")
    sampler.set_epoch(epoch + 1)
    whole = [i for batch in loader for i in ids_of(batch, id_of)]
    check(whole == sampler.indices(epoch + 1), "the epoch after the resumed one is not whole, "
                                               "in the sampler's order")

    # A loader built first, the epoch set afterwards (a training loop's
    # set_epoch at the top of each epoch): that epoch is what it reads.
    fresh_sampler, fresh_loader = make(a, ds)
    fresh_sampler.set_epoch(3)
    fresh = [i for batch in fresh_loader for i in ids_of(batch, id_of)]
    check(fresh == fresh_sampler.indices(3), "a loader built before set_epoch(3) did not read "
                                             "epoch 3's order")
    print(f"resumed, {a.num_workers} workers: {len(saved)} + {len(rest)} = the rank's "
          f"{len(expected)} samples; next epoch whole")


if __name__ == "__main__":
    main()
