"""Bad input to every public entry point gives the documented exception, with a
message that names what was wrong: a wrong type for each argument of
granary.Dataset, its methods and the native Session, an unknown dataset, an
unsafe or unknown path; with torch importable, every argument of
granary.torch.DistributedSampler and ImageFolder as well."""

import argparse
import functools

import granary
from granary import _native
from granary_test_util import check, expect_raises


def call(f, *args, **kwargs):
    """f(*args, **kwargs) as a one-argument-free callable expect_raises can run."""
    return functools.update_wrapper(functools.partial(f, *args, **kwargs), f)


def dataset_inputs(name):
    D = granary.Dataset
    expect_raises(TypeError, call(D, 3), contains="name must be a str")
    expect_raises(TypeError, call(D, name, socket=3), contains="socket must be a path")
    expect_raises(TypeError, call(D, name, zero_copy="yes"), contains="zero_copy must be a bool")
    expect_raises(TypeError, call(D, name, lookahead="64"), contains="lookahead must be an int")
    expect_raises(ValueError, call(D, name, lookahead=5000), contains="[0, 1024]")
    expect_raises(TypeError, call(D, name, verify_checksums=1),
                  contains="verify_checksums must be a bool")
    e = expect_raises(KeyError, call(len, D("no-such-dataset")))
    check("no-such-dataset" in str(e), f"the unknown dataset is not named: {e}")
    ds = D(name)
    n = len(ds)
    expect_raises(TypeError, call(ds.__getitem__, "3"), contains="must be integers")
    expect_raises(TypeError, call(ds.__getitem__, 1.5), contains="must be integers")
    expect_raises(IndexError, call(ds.__getitem__, n), contains=f"for {n} samples")
    expect_raises(TypeError, call(ds.__getitems__, ["a"]), contains="must be integers")
    expect_raises(TypeError, call(ds.path, None), contains="must be integers")
    expect_raises(TypeError, call(ds.index, 3), contains="needs a str path")
    expect_raises(ValueError, call(ds.index, "/etc/passwd"), contains="/etc/passwd")
    expect_raises(ValueError, call(ds.index, "a/../b"), contains="a/../b")
    expect_raises(KeyError, call(ds.index, "no/such/file.jpg"))
    expect_raises(IndexError, call(ds.paths, 0, n + 1), contains="out of range")

    # The native layer names the argument too.
    S = _native.Session
    expect_raises(TypeError, call(S, 3), contains="dataset must be a str")
    expect_raises(TypeError, call(S, name, lookahead="x"), contains="lookahead must be an int")
    expect_raises(TypeError, call(S, name, connect_timeout="1"), contains="connect_timeout")
    expect_raises(ValueError, call(S, name, call_timeout=-1), contains="positive")
    expect_raises(TypeError, call(S, name, verify_checksums="no"), contains="verify_checksums")
    expect_raises(TypeError, call(S, name, bogus=1))
    s = S(name)
    expect_raises(TypeError, call(s.read, "1"), contains="must be an integer")
    expect_raises(IndexError, call(s.read, -1), contains="out of range")
    expect_raises(IndexError, call(s.read, 2 ** 70), contains="out of range")
    expect_raises(TypeError, call(s.read_many, 5), contains="iterable of integers")
    expect_raises(TypeError, call(s.get_many, [0, "1"]), contains="must be an integer")
    expect_raises(TypeError, call(s.paths, "0", 1), contains="first must be an integer")
    expect_raises(TypeError, call(s.lookup, b"a.jpg"), contains="path must be a str")
    expect_raises(ValueError, call(s.set_plan, "p", 0, 0, 1, 0, mode="spiral"), contains="spiral")
    expect_raises(TypeError, call(s.announce_sampler, 0, 0, 1, 0, "yes", False),
                  contains="shuffle must be a bool")
    expect_raises(TypeError, call(_native.rank_samples, 10, "0", 0, 1, 0, True, False),
                  contains="seed must be an integer")
    expect_raises(OverflowError, call(_native.rank_samples, 10, -1, 0, 1, 0, True, False),
                  contains="seed")
    expect_raises(ValueError, call(_native.rank_share, 10, 0, False), contains="num_replicas")
    expect_raises(TypeError, call(granary.Sample), contains="cannot be created directly")


def torch_inputs(name):
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed here: granary.torch's bad inputs are not checked")
        return
    from granary.torch import DistributedSampler, ImageFolder
    ds = granary.Dataset(name)
    Ds = DistributedSampler
    expect_raises(TypeError, call(Ds, object(), 1, 0), contains="sized dataset")
    expect_raises(TypeError, call(Ds, ds, "2", 0), contains="num_replicas must be an int")
    expect_raises(TypeError, call(Ds, ds, 2, 0.5), contains="rank must be an int")
    expect_raises(ValueError, call(Ds, ds, 2, 2), contains="Invalid rank 2")
    expect_raises(TypeError, call(Ds, ds, 2, 0, shuffle="yes"), contains="shuffle must be a bool")
    expect_raises(TypeError, call(Ds, ds, 2, 0, seed="1"), contains="seed must be an int")
    expect_raises(TypeError, call(Ds, ds, 2, 0, drop_last=None), contains="drop_last")
    sampler = Ds(ds, 2, 0)
    expect_raises(TypeError, call(sampler.set_epoch, "1"), contains="set_epoch")
    expect_raises(ValueError, call(sampler.load_state_dict, "state"), contains="state_dict()")
    expect_raises(ValueError, call(sampler.state_dict, len(ds)), contains="consumed")

    F = ImageFolder
    expect_raises(TypeError, call(F, 3), contains="root must be a str")
    expect_raises(ValueError, call(F, "/data/imagenet/train"), contains="Granary dataset's name")
    expect_raises(ValueError, call(F, f"{name}/../x"), contains="without '.' or '..'")
    expect_raises(TypeError, call(F, name, transform=3), contains="transform must be callable")
    expect_raises(TypeError, call(F, name, target_transform="x"), contains="target_transform")
    expect_raises(TypeError, call(F, name, loader=None), contains="loader must be callable")
    expect_raises(TypeError, call(F, name, is_valid_file=".jpg"), contains="is_valid_file")
    expect_raises(TypeError, call(F, name, allow_empty="no"), contains="allow_empty")
    e = expect_raises(KeyError, call(F, "no-such-dataset"))
    check("no-such-dataset" in str(e), f"the unknown dataset is not named: {e}")
    expect_raises(FileNotFoundError, call(F, f"{name}/no-such-folder"), contains="no-such-folder")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    a = p.parse_args()
    dataset_inputs(a.dataset)
    torch_inputs(a.dataset)
    print("bad inputs ok")


if __name__ == "__main__":
    main()
