"""granary: read Granary datasets from training code.

A dataset is served by the granary-sidecar of the pod (or job node) over a
Unix socket; sample bytes arrive in shared memory that this process maps.

    import granary
    ds = granary.Dataset("imagenet")          # socket: $GRANARY_SOCKET
    len(ds), ds[0], ds.path(0), ds.index("train/n01440764/x.JPEG")

PyTorch integration (DistributedSampler, ImageFolder) is in granary.torch.
docs/client.md describes the package; the C++ API it binds is libgranary-client.
"""

import operator
import os
import sys

if sys.version_info < (3, 9):  # the wheel is cp39-abi3; sources copied to an older Python
    raise ImportError(f"granary needs CPython 3.9 or later; this is "
                      f"{sys.version.split()[0]} ({sys.executable})")
from typing import Any, Dict, Iterable, Iterator, List, Optional, SupportsIndex, Tuple, Union

from . import _native
from ._native import Error, Sample, rank_samples, rank_share

__all__ = ["Dataset", "Sample", "Error", "rank_samples", "rank_share", "read_file",
           "__version__"]

#: The package's version: the project's (CMakeLists.txt), compiled into the module.
__version__: str = _native.__version__

# Forks this process descends through: a Dataset remembers the value its
# session was opened at and opens another when it differs (a DataLoader
# worker). Cheaper on every ds[i] than asking os.getpid(), a system call.
_forks = 0


def _forked() -> None:
    global _forks  # noqa: PLW0603 (the process-wide fork count)
    _forks += 1


os.register_at_fork(after_in_child=_forked)


def read_file(path: Union[str, "os.PathLike[str]"]) -> bytes:
    """The whole file at `path` as bytes, opened unbuffered.

    For code that reads files of a ``granary mount`` (or any FUSE file system)
    by path: Python's buffered ``open(path, "rb")`` asks ``isatty()`` of every
    file before 3.14, an ioctl the kernel forwards to the file system on every
    open, uncached. Opened with ``buffering=0`` there is none, so a file in the
    page cache costs no request at all (docs/posix-view.md).
    """
    with open(path, "rb", buffering=0) as f:
        return f.read()


class Dataset:
    """A Granary dataset, map-style: ``len(ds)``, ``ds[i]``.

    ``ds[i]`` is the sample's bytes (a copy), or with ``zero_copy=True`` a
    :class:`granary.Sample` over its mapped chunk file (direct reads, below) or
    the sidecar's shared memory: it supports the
    buffer protocol (``memoryview(s)``, ``numpy.frombuffer(s)`` without a
    copy), stays valid until ``s.release()`` (or the end of a ``with`` block,
    or garbage collection), and must not be used after that.

    Indices are sample ids (sorted path order); negative indices count from
    the end as for a list. ``ds.path(i)`` and ``ds.index(path)`` map between
    ids and paths relative to the dataset root.

    On the sidecar's host, ``ds[i]`` and ``ds.__getitems__`` (copies and
    zero-copy) read staged samples straight from the cache node's chunk files
    the sidecar hands over, mapped read-only, each verified with XXH3, and
    everything else through the sidecar (docs/client.md, "Direct reads"). ``direct_reads=False`` (or
    ``$GRANARY_DIRECT_READS=0`` when the argument is not given) reads every
    sample through the sidecar.

    The session with the sidecar is opened on first use and re-opened in a
    forked child (a DataLoader worker); it is never pickled, so spawned
    workers open their own.
    """

    def __init__(self, name: str, socket: Union[str, "os.PathLike[str]", None] = None,
                 zero_copy: bool = False, lookahead: int = 64,
                 verify_checksums: bool = False, direct_reads: Optional[bool] = None) -> None:
        if not isinstance(name, str):
            raise TypeError(f"granary.Dataset name must be a str (the dataset's name, e.g. "
                            f"'imagenet'), not {type(name).__name__}")
        if socket is not None and not isinstance(socket, (str, os.PathLike)):
            raise TypeError(f"granary.Dataset socket must be a path (str or os.PathLike) or "
                            f"None for $GRANARY_SOCKET, not {type(socket).__name__}")
        for flag, value in (("zero_copy", zero_copy), ("verify_checksums", verify_checksums)):
            if not isinstance(value, bool):
                raise TypeError(f"granary.Dataset {flag} must be a bool, not "
                                f"{type(value).__name__}")
        if direct_reads is not None and not isinstance(direct_reads, bool):
            raise TypeError(f"granary.Dataset direct_reads must be a bool or None (for "
                            f"$GRANARY_DIRECT_READS), not {type(direct_reads).__name__}")
        if isinstance(lookahead, bool) or not isinstance(lookahead, int):
            raise TypeError(f"granary.Dataset lookahead must be an int, not "
                            f"{type(lookahead).__name__}")
        if not 0 <= lookahead <= 1024:
            raise ValueError(f"granary.Dataset lookahead must be in [0, 1024], not {lookahead}")
        self.name = name
        self.socket: Optional[str] = os.fspath(socket) if socket is not None else None
        self.zero_copy = zero_copy
        self.lookahead = lookahead
        self.verify_checksums = verify_checksums
        self.direct_reads = (direct_reads if direct_reads is not None
                             else os.environ.get("GRANARY_DIRECT_READS", "1") != "0")
        self._session: Optional[_native.Session] = None
        self._fork: Optional[int] = None  # _forks when the session was opened
        self._len: Optional[int] = None

    # ---- the session -----------------------------------------------------------

    @property
    def session(self) -> _native.Session:
        """This process's granary._native.Session (opened on first use)."""
        session = self._session
        if session is None or self._fork != _forks:
            # In a forked child the parent's session must not be used (its
            # connection belongs to the parent); dropping it only unmaps.
            self._session = None
            session = _native.Session(self.name, socket=self.socket or "",
                                      client_name=f"python/{os.getpid()}",
                                      lookahead=self.lookahead,
                                      verify_checksums=self.verify_checksums,
                                      direct_reads=self.direct_reads)
            self._session = session
            self._fork = _forks
            self._len = session.sample_count
        return session

    def close(self) -> None:
        """Closes this process's session (pins held by Samples stay until they go)."""
        self._session = None
        self._fork = None

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_session"] = None
        state["_fork"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.pop("_pid", None)  # pickled by an older granary
        self._session = None
        self._fork = None

    # ---- map-style access ------------------------------------------------------

    def __len__(self) -> int:
        if self._len is None:
            return self.session.sample_count  # opening it sets _len
        return self._len

    def _id(self, index: SupportsIndex) -> int:
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"granary.Dataset indices must be integers, not "
                            f"{type(index).__name__}") from None
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"granary.Dataset {self.name!r}: index {i} is out of range for "
                             f"{n} samples")
        return j

    def __getitem__(self, index: Union[SupportsIndex, slice]) -> Any:
        """The sample's bytes (``zero_copy=False``) or its :class:`Sample`; a list for a slice."""
        # The per-sample path of map-style training code: an int checked
        # inline, the session as it is unless this is a new process.
        session = self._session
        if session is None or self._fork != _forks:
            session = self.session
        if type(index) is int:
            n = self._len
            assert n is not None  # set when the session was opened
            i = index + n if index < 0 else index
            if not 0 <= i < n:
                raise IndexError(f"granary.Dataset {self.name!r}: index {index} is out of range "
                                 f"for {n} samples")
        elif isinstance(index, slice):
            return self.__getitems__(range(*index.indices(len(self))))
        else:
            i = self._id(index)
        return session.get(i) if self.zero_copy else session.read(i)

    def __getitems__(self, indices: Iterable[SupportsIndex]) -> List[Any]:
        """Many samples at once (one round trip where possible); a list."""
        ids = [self._id(i) for i in indices]
        if not ids:
            return []
        session = self.session
        return session.get_many(ids) if self.zero_copy else session.read_many(ids)

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    # ---- metadata ------------------------------------------------------------------

    def path(self, index: SupportsIndex) -> str:
        """The sample's path relative to the dataset root."""
        return self.session.stat(self._id(index))[0]

    def stat(self, index: SupportsIndex) -> Tuple[str, int, int]:
        """(path, size, mtime_ns) of the sample, from the manifest."""
        return self.session.stat(self._id(index))

    def paths(self, first: int = 0, count: Optional[int] = None) -> List[str]:
        """Paths of samples [first, first + count) (default: all), in id order."""
        n = len(self)
        if count is None:
            count = n - first
        if first < 0 or count < 0 or first + count > n:
            raise IndexError(f"granary.Dataset {self.name!r}: paths [{first}, {first + count}) "
                             f"are out of range for {n} samples")
        return self.session.paths(first, count)

    def directories(self) -> List[Tuple[str, int]]:
        """[(path, mode)] of every directory in the dataset but its root.

        Paths are relative to the dataset root ("a", "a/b"), sorted as the
        manifest holds them (a parent before its children); directories that
        hold no file are listed too, with their permission bits at snapshot
        time. A manifest of format version 1 recorded only the directories its
        files imply (mode 0o555). granary.Error (code VERSION_MISMATCH) when
        the sidecar is too old to list directories: upgrade granary-sidecar.
        """
        return self.session.directories()

    def index(self, path: Union[str, "os.PathLike[str]"]) -> int:
        """The id of ``path`` (relative to the dataset root).

        ValueError for a path that could leave the root (absolute, '..', '.'
        or empty components); KeyError for one the dataset does not hold.
        """
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise TypeError(f"granary.Dataset.index needs a str path, not {type(path).__name__}")
        _native.validate_sample_path(path)
        return self.session.lookup(path)

    # ---- plans ------------------------------------------------------------------------

    def announce_sampler(self, seed: int, epoch: int, num_replicas: int, rank: int,
                         shuffle: bool, drop_last: bool, start_position: int = 0) -> None:
        """Tells the sidecar the order a DistributedSampler will read (SET_PLAN)."""
        self.session.announce_sampler(seed, epoch, num_replicas, rank, shuffle, drop_last,
                                      start_position)

    def __repr__(self) -> str:
        return (f"granary.Dataset({self.name!r}, socket={self.socket!r}, "
                f"zero_copy={self.zero_copy})")
