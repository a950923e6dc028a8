"""granary.torch.DistributedSampler against torch.utils.data.DistributedSampler
itself, on plain sized datasets (no sidecar needed): the same sizes, padding
and drop_last for every (n, num_replicas, rank); with shuffle=False the very
same indices; with shuffle=True a permutation with the same partitioning; the
same errors; set_epoch changes the order; resuming skips what was consumed."""

import torch.utils.data

import granary
from granary.torch import DistributedSampler
from granary_test_util import check, expect_raises


class Sized(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def main():
    cases = 0
    for n in (0, 1, 2, 5, 10, 11, 97, 100):
        for world in (1, 2, 3, 4, 7):
            for drop_last in (False, True):
                everyone = []
                for rank in range(world):
                    ds = Sized(n)
                    ours = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False,
                                              drop_last=drop_last)
                    theirs = torch.utils.data.DistributedSampler(
                        ds, num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
                    what = f"n={n} world={world} rank={rank} drop_last={drop_last}"
                    check(ours.num_samples == theirs.num_samples, f"{what}: num_samples")
                    check(ours.total_size == theirs.total_size, f"{what}: total_size")
                    check(len(ours) == len(theirs), f"{what}: len")
                    if n > 0:
                        check(list(ours) == list(theirs), f"{what}: shuffle=False indices "
                              f"{list(ours)} != torch's {list(theirs)}")
                    shuffled = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                                  seed=3, drop_last=drop_last)
                    got = list(shuffled)
                    check(len(got) == theirs.num_samples, f"{what}: shuffled length")
                    check(got == granary.rank_samples(n, 3, 0, world, rank, True, drop_last),
                          f"{what}: not the plan code's order")
                    everyone += got
                    cases += 1
                if n > 0 and not drop_last:
                    check(set(everyone) == set(range(n)),
                          f"n={n} world={world}: the ranks do not cover the epoch")
                if drop_last:
                    check(len(everyone) == len(set(everyone)),
                          f"n={n} world={world}: ranks overlap with drop_last")

    ds = Sized(50)
    s = DistributedSampler(ds, num_replicas=2, rank=0, seed=1)
    e0 = list(s)
    s.set_epoch(1)
    check(list(s) != e0, "set_epoch does not change the order")
    check(list(s) == s.indices(1), "indices(epoch)")
    check(sorted(e0) != e0, "shuffle=True gives id order")

    # The same errors as torch's sampler.
    for rank in (2, -1):
        ours = expect_raises(ValueError, DistributedSampler, ds, 2, rank)
        theirs = expect_raises(ValueError, torch.utils.data.DistributedSampler, ds, 2, rank)
        check(str(ours) == str(theirs), f"rank {rank}: {ours!s} vs torch's {theirs!s}")
    try:
        torch.utils.data.DistributedSampler(ds)
        torch_error = None
    except Exception as e:  # noqa: BLE001
        torch_error = type(e)
    check(torch_error is not None, "torch's sampler needs an initialised process group here")
    expect_raises(torch_error, DistributedSampler, ds)
    expect_raises(ValueError, DistributedSampler, ds, 0, 0)

    # Any seed torch accepts (negative, huge) works; the state keeps it.
    for seed in (-1, 2**70):
        big = DistributedSampler(ds, num_replicas=1, rank=0, seed=seed)
        check(len(list(big)) == 50 and big.state_dict()["seed"] == seed, f"seed {seed}")

    # Resuming without a DataLoader: consumed defaults to what was handed out.
    s = DistributedSampler(ds, num_replicas=2, rank=1, seed=9)
    s.set_epoch(4)
    it = iter(s)
    first = [next(it) for _ in range(7)]
    state = s.state_dict()
    check(state["consumed"] == 7 and state["epoch"] == 4, f"state {state}")
    t = DistributedSampler(ds, num_replicas=2, rank=1, seed=9)
    t.load_state_dict(state)
    rest = list(t)
    check(first + rest == s.indices(4), "resumed order")
    check(len(t) == t.num_samples and len(list(t)) == t.num_samples,
          "the next iteration is whole again")
    print(f"{cases} sampler configurations agree with torch's DistributedSampler")


if __name__ == "__main__":
    main()
