"""Resuming an epoch with the sampler's state_dict / load_state_dict.

--phase first: reads --stop-after batches of epoch --epoch (DataLoader with 2
workers), saves sampler.state_dict(consumed=batches * batch_size) and the ids
read to --state, and exits mid-epoch (as a preempted job would).
--phase second: a new process builds the same sampler, loads the state, reads
the rest of the epoch and checks that the two runs together are exactly the
rank's share, in order; the next epoch is whole again. Also checks that a
state of another configuration is refused with a ValueError naming the field.
"""

import argparse

import torch.utils.data

import granary
from granary.torch import DistributedSampler
from granary_test_util import (check, collate_list, expect_raises, id_of_bytes, read_json,
                               read_source, write_json)


def make(a, ds):
    sampler = DistributedSampler(ds, num_replicas=a.world_size, rank=a.rank, shuffle=True,
                                 seed=a.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, sampler=sampler,
                                         num_workers=2, collate_fn=collate_list)
    return sampler, loader


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phase", required=True, choices=["first", "second"])
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--epoch", type=int, default=1)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--stop-after", type=int, default=5)
    a = p.parse_args()

    ds = granary.Dataset(a.dataset)
    id_of = id_of_bytes(read_source(a.source_root, ds.paths()))
    sampler, loader = make(a, ds)

    if a.phase == "first":
        sampler.set_epoch(a.epoch)
        ids = []
        for i, batch in enumerate(loader):
            ids += [id_of.get(data, -1) for data in batch]
            if i + 1 == a.stop_after:
                break
        consumed = a.stop_after * a.batch_size
        check(len(ids) == consumed, f"read {len(ids)} samples in {a.stop_after} batches")
        # Without an argument, consumed counts what the sampler handed out,
        # which with workers prefetching is at least what was processed.
        check(sampler.state_dict()["consumed"] >= consumed, "default consumed")
        state = sampler.state_dict(consumed=consumed)
        check(state == {"epoch": a.epoch, "seed": a.seed, "num_replicas": a.world_size,
                        "rank": a.rank, "shuffle": True, "drop_last": False,
                        "consumed": consumed}, f"state_dict() is {state}")
        write_json(a.state, {"state": state, "ids": ids})
        print(f"first run: stopped after {consumed} samples")
        return

    saved = read_json(a.state)
    state = saved["state"]
    for key, value in (("seed", a.seed + 1), ("rank", 1 - a.rank), ("num_replicas", 3),
                       ("shuffle", False), ("drop_last", True)):
        bad = dict(state, **{key: value})
        expect_raises(ValueError, DistributedSampler(
            ds, num_replicas=a.world_size, rank=a.rank, seed=a.seed).load_state_dict, bad,
            contains=key)
    expect_raises(ValueError, sampler.load_state_dict, dict(state, consumed=10**9),
                  contains="consumed")
    expect_raises(ValueError, sampler.load_state_dict, {"epoch": 1}, contains="lacks")

    sampler.load_state_dict(state)
    check(sampler.epoch == a.epoch, f"epoch after load is {sampler.epoch}")
    check(len(sampler) == sampler.num_samples - state["consumed"],
          f"len(sampler) after load is {len(sampler)}")
    rest = [id_of.get(data, -1) for batch in loader for data in batch]
    expected = sampler.indices(a.epoch)
    check(saved["ids"] + rest == expected,
          f"first run ({len(saved['ids'])}) + resumed run ({len(rest)}) is not the rank's "
          f"share of {len(expected)} in order")
    sampler.set_epoch(a.epoch + 1)
    check(len(sampler) == sampler.num_samples, "the epoch after the resumed one is not whole")
    whole = [id_of.get(data, -1) for batch in loader for data in batch]
    check(whole == sampler.indices(a.epoch + 1), "the next epoch is not the sampler's order")
    print(f"resumed: {len(saved['ids'])} + {len(rest)} = the rank's {len(expected)} samples; "
          f"next epoch whole")


if __name__ == "__main__":
    main()
