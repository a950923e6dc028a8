"""granary.Dataset's map-style API against a real sidecar: len, indexing
(negative, out of range, slices, __getitems__), path/index (unsafe paths
rejected), zero-copy Samples (buffer protocol, numpy, release, pickling, GC),
and re-opening the session in a forked child."""

import argparse
import gc
import os
import pickle

try:  # the venvs of the pyenv CPythons have the wheel and nothing else
    import numpy
except ImportError:
    numpy = None

import granary
from granary_test_util import check, expect_raises, read_source


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    a = p.parse_args()

    ds = granary.Dataset(a.dataset)
    n = len(ds)
    paths = ds.paths()
    source = read_source(a.source_root, paths)
    check(n == len(paths) == len(source) and n > 10, f"len {n}, {len(paths)} paths")

    # Indexing.
    check(ds[0] == source[0] and ds[n - 1] == source[n - 1], "ds[0], ds[n-1]")
    check(ds[-1] == source[-1] and ds[-n] == source[0], "negative indices")
    expect_raises(IndexError, ds.__getitem__, n)
    expect_raises(IndexError, ds.__getitem__, -n - 1)
    expect_raises(TypeError, ds.__getitem__, "3")
    expect_raises(TypeError, ds.__getitem__, 1.0)
    expect_raises(TypeError, ds.__getitem__, None)
    if numpy is not None:
        check(ds[numpy.int64(3)] == source[3], "numpy ints index")
    check(ds[True] == source[1], "index-like ints")
    e = expect_raises(IndexError, ds.__getitem__, n + 5)
    check(str(n + 5) in str(e) and str(n) in str(e), f"the message names index and size: {e}")
    # Every sample in a plan's order, as a training loop reads it: most come
    # from the session's hints (no round trip), each the source's bytes.
    order = granary.rank_samples(n, 5, 0, 1, 0, True, False)
    ds.announce_sampler(5, 0, 1, 0, True, False)
    check([ds[i] for i in order] == [source[i] for i in order], "a plan's order, ds[i] by ds[i]")
    check(ds.session.pinned_count == ds.session.hint_count,
          f"after the loop only hints are pinned: {ds.session.pinned_count} pins, "
          f"{ds.session.hint_count} hints")
    check(ds[2:5] == source[2:5], "slice")
    check(ds.__getitems__([3, 1, -1, 3]) == [source[3], source[1], source[-1], source[3]],
          "__getitems__")
    expect_raises(IndexError, ds.__getitems__, [0, n])

    # Paths.
    for i in (0, 7, n - 1):
        check(ds.path(i) == paths[i], f"path({i})")
        check(ds.index(paths[i]) == i, f"index(path({i}))")
        check(ds.stat(i)[1] == len(source[i]), f"stat({i}) size")
    for bad in ("../x", "/etc/passwd", "a/../b", "", "./" + paths[0], paths[0] + "/"):
        expect_raises(ValueError, ds.index, bad)
    e = expect_raises(ValueError, ds.index, "../x")
    check("'../x'" in str(e), f"the message names the path: {e}")
    expect_raises(KeyError, ds.index, "no/such/file.bin")
    expect_raises(TypeError, ds.index, 3)

    # Zero copy.
    z = granary.Dataset(a.dataset, zero_copy=True)
    s = z[5]
    check(isinstance(s, granary.Sample), f"zero-copy item is {type(s)}")
    check(bytes(s) == source[5] and s.tobytes() == source[5] and len(s) == len(source[5]),
          "Sample bytes")
    check(s == source[5], "Sample == bytes")
    m = memoryview(s)
    check(m.readonly and m.nbytes == len(source[5]) and m.tobytes() == source[5], "memoryview")
    if numpy is not None:
        arr = numpy.frombuffer(s, dtype=numpy.uint8)
        arr2 = numpy.frombuffer(s, dtype=numpy.uint8)
        check(not arr.flags.writeable, "numpy view must be read-only")
        check(numpy.shares_memory(arr, arr2), "numpy.frombuffer copied (no shared memory)")
        check(arr.tobytes() == source[5], "numpy bytes")
        del arr, arr2
    else:
        print("numpy is not installed here: the numpy.frombuffer checks are skipped")
    check(pickle.loads(pickle.dumps(s)) == source[5], "a Sample pickles as its bytes")
    check(s.id == 5 and s.size == len(source[5]), "Sample id/size")
    m2 = memoryview(s)
    expect_raises(BufferError, s.release)  # a buffer is alive
    del m, m2
    s.release()
    check(s.released, "released")
    expect_raises(ValueError, memoryview, s)
    expect_raises(ValueError, bytes, s)
    with z[6] as t:
        check(bytes(t) == source[6], "context manager")
    check(t.released, "the with block released it")
    many = z.__getitems__([1, 2, 3])
    check([bytes(x) for x in many] == source[1:4], "zero-copy __getitems__")
    session = z.session
    check(session.pinned_count >= 3, f"pins {session.pinned_count}")
    del many
    gc.collect()
    check(session.pinned_count == session.hint_count,
          f"after GC: {session.pinned_count} pins, {session.hint_count} of them hints")

    # Fork: the child re-opens its own session and reads the right bytes.
    parent_session = ds.session
    pid = os.fork()
    if pid == 0:
        ok = ds[9] == source[9] and ds.session is not parent_session and \
            ds.session.pid == os.getpid()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "forked child read")
    # A grandchild (a worker forked by a forked process) opens its own too.
    pid = os.fork()
    if pid == 0:
        child_ok = ds[8] == source[8]
        child_session = ds.session
        grandchild = os.fork()
        if grandchild == 0:
            ok = ds[7] == source[7] and ds.session is not child_session and \
                ds.session.pid == os.getpid()
            os._exit(0 if ok else 1)
        _, gstatus = os.waitpid(grandchild, 0)
        ok = child_ok and os.WIFEXITED(gstatus) and os.WEXITSTATUS(gstatus) == 0 and \
            ds.session is child_session and ds[6] == source[6]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "forked grandchild read")
    check(ds.session is parent_session and ds[10] == source[10], "parent after fork")

    # Pickling a Dataset carries no session.
    copy = pickle.loads(pickle.dumps(ds))
    check(copy._session is None and copy[4] == source[4], "unpickled Dataset")
    expect_raises(KeyError, granary.Dataset("no-such-dataset").__len__)
    print(f"api ok over {n} samples")


if __name__ == "__main__":
    main()
