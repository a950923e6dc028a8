"""PyTorch integration: a DistributedSampler whose order Granary knows in
advance, and torchvision's ImageFolder over a Granary dataset.

    from granary.torch import DistributedSampler, ImageFolder
    ds = ImageFolder("imagenet/train", transform=tf)     # (PIL image, class index)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=256, sampler=sampler,
                                         num_workers=8)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader: ...

Needs PyTorch (1.13 or 2.x): ``pip install 'granary[torch]'``, which brings
Pillow for the default loader too. docs/client.md describes both classes,
fork/spawn workers and resuming.
"""

import io
import os
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple,
                    Union)

try:
    import torch.distributed as dist
    import torch.utils.data
except ImportError as e:  # pragma: no cover (exercised by the venv tests without torch)
    raise ImportError(f"granary.torch needs PyTorch, which this Python cannot import ({e}); "
                      f"install it with: pip install 'granary[torch]'") from e

from . import Dataset, _native, read_file

__all__ = ["DistributedSampler", "ImageFolder", "pil_loader", "pil_file_loader",
           "bytes_loader", "IMG_EXTENSIONS"]

_U64 = (1 << 64) - 1


def _granary_dataset(dataset: object) -> Optional[Dataset]:
    """The granary.Dataset whose sample ids are `dataset`'s indices, or None."""
    if isinstance(dataset, Dataset):
        return dataset
    if isinstance(dataset, ImageFolder) and dataset.indices_are_sample_ids:
        return dataset.dataset
    return None


class DistributedSampler(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """torch.utils.data.DistributedSampler with Granary's plan order.

    Same constructor, defaults and partitioning (num_samples, total_size,
    padding by repeating the order's start, drop_last) as PyTorch's; the
    permutation comes from Granary's plan code (shuffle=True is plan mode
    "global", shuffle=False "sequential"), so the sidecar can prefetch exactly
    what this rank reads next. Accepts any sized dataset; over a
    granary.Dataset (or a granary ImageFolder over one) each __iter__
    announces the plan to the sidecar.

    Resuming: ``state_dict(consumed)`` records the epoch and how many of this
    rank's samples were processed; ``load_state_dict`` makes the next
    ``__iter__`` start right after them (later epochs are whole again). The
    two are what torchdata's ``StatefulDataLoader`` calls: with it,
    ``loader.state_dict()`` holds this sampler's state at the last batch the
    loader yielded, and ``loader.load_state_dict()`` resumes right after it.
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False) -> None:
        try:
            size = len(dataset)
        except TypeError:
            raise TypeError(f"granary DistributedSampler needs a sized dataset (with __len__), "
                            f"not {type(dataset).__name__}") from None
        for name, value in (("num_replicas", num_replicas), ("rank", rank)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"granary DistributedSampler {name} must be an int or None, "
                                f"not {type(value).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"granary DistributedSampler seed must be an int, not "
                            f"{type(seed).__name__}")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool):
                raise TypeError(f"granary DistributedSampler {name} must be a bool, not "
                                f"{type(flag).__name__}")
        if num_replicas is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            rank = dist.get_rank()
        if num_replicas < 1:
            raise ValueError(f"Invalid num_replicas {num_replicas}, num_replicas should be at "
                             f"least 1")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        super().__init__(None)
        self.dataset = dataset
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.epoch = 0
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_samples, self.total_size = _native.rank_share(size, self.num_replicas,
                                                               self.drop_last)
        self._resume_at: Optional[int] = None  # consumed samples to skip at the next __iter__
        self._yielded = 0  # this epoch's samples handed out by __iter__

    def indices(self, epoch: Optional[int] = None) -> List[int]:
        """This rank's indices for `epoch` (default: the current one), in order."""
        return _native.rank_samples(len(self.dataset), self.seed & _U64,
                                    self.epoch if epoch is None else epoch, self.num_replicas,
                                    self.rank, self.shuffle, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        # A generator: the epoch, the resume position and the announcement are
        # taken when the first index is asked for, not when iter() is called.
        # torchdata's StatefulDataLoader makes its BatchSampler's iterator
        # when the loader is built, before the training loop's set_epoch().
        indices = self.indices()
        start = min(self._resume_at or 0, len(indices))
        self._resume_at = None
        self._yielded = start
        granary_dataset = _granary_dataset(self.dataset)
        if granary_dataset is not None:
            granary_dataset.announce_sampler(self.seed & _U64, self.epoch, self.num_replicas,
                                             self.rank, self.shuffle, self.drop_last, start)
        for position in range(start, len(indices)):
            self._yielded = position + 1
            yield indices[position]

    def __len__(self) -> int:
        # The samples the next __iter__ yields: fewer when resuming mid-epoch.
        return self.num_samples - (self._resume_at or 0)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch for the next __iter__ (a different order every epoch when shuffling).

        A position loaded with load_state_dict is kept when `epoch` is the
        loaded epoch and dropped for another one: it belongs to its epoch."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise TypeError(f"granary DistributedSampler.set_epoch needs an int >= 0, not "
                            f"{epoch!r}")
        if epoch != self.epoch:
            self._resume_at = None
        self.epoch = epoch
        self._yielded = self._resume_at or 0

    # ---- resuming --------------------------------------------------------------------

    _STATE_KEYS = ("epoch", "seed", "num_replicas", "rank", "shuffle", "drop_last", "consumed")

    def state_dict(self, consumed: Optional[int] = None) -> Dict[str, Any]:
        """Where this rank is: the epoch and how many of its samples were consumed.

        `consumed` defaults to how many samples __iter__ has handed out this
        epoch. A DataLoader fetches ahead of the training step (workers,
        prefetch_factor), so pass what the training loop actually processed,
        e.g. batches_done * batch_size; samples handed out but not processed
        are then read again after the restart rather than skipped.
        """
        if consumed is None:
            consumed = self._yielded
        consumed = int(consumed)
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"granary DistributedSampler.state_dict: consumed={consumed} is "
                             f"outside [0, {self.num_samples}], the samples of this rank's epoch")
        return {"epoch": self.epoch, "seed": self.seed, "num_replicas": self.num_replicas,
                "rank": self.rank, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "consumed": consumed}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes from a state_dict: the next __iter__ starts after `consumed` samples."""
        if not isinstance(state, dict):
            raise ValueError(f"granary DistributedSampler.load_state_dict: expected the dict "
                             f"state_dict() returned, got {type(state).__name__}")
        missing = [key for key in self._STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"granary DistributedSampler.load_state_dict: the state lacks "
                             f"{', '.join(missing)}; pass what state_dict() returned")
        for key in ("seed", "num_replicas", "rank", "shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise ValueError(f"granary DistributedSampler.load_state_dict: {key} is "
                                 f"{state[key]!r} in the state but {getattr(self, key)!r} in this "
                                 f"sampler; construct the sampler with the arguments of the run "
                                 f"that saved it")
        consumed = state["consumed"]
        if not isinstance(consumed, int) or not 0 <= consumed <= self.num_samples:
            raise ValueError(f"granary DistributedSampler.load_state_dict: consumed is "
                             f"{consumed!r}, not a count in [0, {self.num_samples}] (this rank's "
                             f"samples per epoch); is the dataset the same?")
        epoch = state["epoch"]
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"granary DistributedSampler.load_state_dict: epoch is {epoch!r}, "
                             f"not a count from 0")
        self.epoch = epoch
        self._resume_at = consumed
        self._yielded = consumed


#: The file name extensions torchvision's ImageFolder takes by default (lower case).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def pil_loader(data: Any) -> Any:
    """Bytes of an image file → an RGB PIL image (torchvision's default loader);
    ImageFolder's default."""
    try:
        from PIL import Image  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(f"granary.torch.pil_loader needs Pillow ({e}); install it with "
                          f"pip install 'granary[torch]', or give ImageFolder a loader of "
                          f"your own (loader=granary.torch.bytes_loader for the bytes)") from e
    with Image.open(io.BytesIO(bytes(data))) as image:
        return image.convert("RGB")


def bytes_loader(data: bytes) -> bytes:
    """The sample's bytes as they are: ``ImageFolder(root, loader=bytes_loader)`` to
    decode in a transform of your own."""
    return data


def pil_file_loader(path: Union[str, "os.PathLike[str]"]) -> Any:
    """torchvision's default loader (an RGB PIL image from a path) for files of a
    ``granary mount``: ``torchvision.datasets.ImageFolder(root,
    loader=granary.torch.pil_file_loader)``. It reads with
    :func:`granary.read_file`, so a file in the page cache costs no FUSE
    request (Python's buffered ``open()`` costs one per file before 3.14)."""
    return pil_loader(read_file(path))


def _split_root(root: Union[str, "os.PathLike[str]", Dataset]) -> Tuple[Optional[Dataset], str,
                                                                           str]:
    """(a Dataset given as root, the dataset's name, the folder in it: '' for its root)."""
    if isinstance(root, Dataset):
        return root, root.name, ""
    if isinstance(root, os.PathLike):
        root = os.fspath(root)
    if not isinstance(root, str):
        raise TypeError(f"granary ImageFolder root must be a str naming a dataset (or a "
                        f"dataset and a folder in it, e.g. 'imagenet/train') or a "
                        f"granary.Dataset, not {type(root).__name__}")
    if root.startswith("/"):
        raise ValueError(f"granary ImageFolder root {root!r} is a directory path; give the "
                         f"Granary dataset's name instead, with a folder inside it if needed "
                         f"(e.g. 'imagenet/train'): `granary dataset list` shows the names")
    parts = [p for p in root.split("/") if p != ""]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"granary ImageFolder root {root!r} must name a dataset, then "
                         f"optionally a folder in it ('imagenet' or 'imagenet/train'), "
                         f"without '.' or '..'")
    return None, parts[0], "/".join(parts[1:])


class ImageFolder(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """torchvision.datasets.ImageFolder over a Granary dataset: the same
    arguments in the same order, the same classes, samples and order, and
    (PIL image, class index) items.

    ``root`` names the dataset, or a folder in it ("imagenet/train"), where
    torchvision takes a directory. Its top-level directories are the classes,
    sorted (a folder that holds no file is still a class: the sidecar lists
    every directory the snapshot walked). A file inside a class folder, at any
    depth, is a sample of that class when ``is_valid_file(path)`` says so, or,
    without ``is_valid_file``, when its name ends with one of torchvision's
    ``IMG_EXTENSIONS`` (any case). Files directly in ``root`` are skipped.
    Samples are in torchvision's order: by class, then by directory, then by
    file name.

    ``samples`` is ``[(path, class index)]`` with paths ``root/class/...`` as
    torchvision builds them from its root; ``targets``, ``imgs``,
    ``classes`` and ``class_to_idx`` are torchvision's. An item is
    ``(loader(bytes), class index)`` with ``transform`` and
    ``target_transform`` applied; the default loader is :func:`pil_loader` (an
    RGB PIL image). Unlike torchvision's, a loader gets the file's bytes, not a
    path (``bytes_loader`` keeps them as they are).

    A class folder without a valid file is an error, as in torchvision
    (FileNotFoundError naming the classes), unless ``allow_empty=True``.
    ``socket`` (keyword only) is the sidecar's socket when not $GRANARY_SOCKET.
    """

    def __init__(self, root: Union[str, "os.PathLike[str]", Dataset],
                 transform: Optional[Callable[[Any], Any]] = None,
                 target_transform: Optional[Callable[[int], Any]] = None,
                 loader: Callable[[bytes], Any] = pil_loader,
                 is_valid_file: Optional[Callable[[str], bool]] = None,
                 allow_empty: bool = False, *,
                 socket: Union[str, "os.PathLike[str]", None] = None) -> None:
        given, name, folder = _split_root(root)
        for what, f in (("transform", transform), ("target_transform", target_transform),
                        ("is_valid_file", is_valid_file)):
            if f is not None and not callable(f):
                raise TypeError(f"granary ImageFolder {what} must be callable or None, not "
                                f"{type(f).__name__}")
        if not callable(loader):
            raise TypeError(f"granary ImageFolder loader must be callable (it gets a file's "
                            f"bytes), not {type(loader).__name__}")
        if not isinstance(allow_empty, bool):
            raise TypeError(f"granary ImageFolder allow_empty must be a bool, not "
                            f"{type(allow_empty).__name__}")
        self.dataset = given if given is not None else Dataset(name, socket=socket)
        self.root = name if not folder else f"{name}/{folder}"
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.is_valid_file = is_valid_file
        self.allow_empty = allow_empty
        prefix = f"{folder}/" if folder else ""
        directories = [path for path, _ in self.dataset.directories()]
        if folder and folder not in directories:
            raise FileNotFoundError(f"granary ImageFolder: dataset {name!r} has no folder "
                                    f"{folder!r}; Dataset({name!r}).directories() lists them")
        self.classes = sorted(path[len(prefix):] for path in directories
                              if path.startswith(prefix) and "/" not in path[len(prefix):])
        if not self.classes:
            raise FileNotFoundError(f"Couldn't find any class folder in granary "
                                    f"{self.root!r} (dataset {name!r})")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        paths = self.dataset.paths()
        chosen = []  # (class index, directory, file name, sample id)
        for i, path in enumerate(paths):
            if not path.startswith(prefix):
                continue
            inner = path[len(prefix):]
            if "/" not in inner:
                continue  # a file directly in root belongs to no class
            cls = inner.split("/", 1)[0]
            full = f"{self.root}/{inner}"
            if is_valid_file is not None:
                if not is_valid_file(full):
                    continue
            elif not full.lower().endswith(IMG_EXTENSIONS):
                continue
            directory, _, file_name = full.rpartition("/")
            chosen.append((self.class_to_idx[cls], directory, file_name, i))
        chosen.sort()  # torchvision: classes sorted, then sorted(os.walk()), sorted(files)
        self._ids = [i for _, _, _, i in chosen]
        self.samples = [(f"{d}/{f}", c) for c, d, f, _ in chosen]
        empty = set(self.classes).difference(self.classes[c] for c, _, _, _ in chosen)
        if empty and not self.allow_empty:
            raise FileNotFoundError(
                f"Found no valid file for the classes {', '.join(sorted(empty))} in granary "
                f"{self.root!r}. Supported extensions are: {', '.join(IMG_EXTENSIONS)} (or "
                f"pass is_valid_file); pass allow_empty=True to keep empty class folders as "
                f"classes without samples, or remove them from the source and snapshot it "
                f"again")
        self.targets = [target for _, target in self.samples]
        self.imgs = self.samples

    @property
    def indices_are_sample_ids(self) -> bool:
        """True when index i is sample id i (every sample taken, in path order): only
        then does the DistributedSampler announce its order to the sidecar."""
        return len(self._ids) == len(self.dataset) and all(
            i == j for i, j in enumerate(self._ids))

    def __len__(self) -> int:
        return len(self.samples)

    def _item(self, data: Any, target: int) -> Tuple[Any, Any]:
        sample = self.loader(data)
        if self.transform is not None:
            sample = self.transform(sample)
        out: Any = target
        if self.target_transform is not None:
            out = self.target_transform(target)
        return sample, out

    def __getitem__(self, index: int) -> Tuple[Any, Any]:
        _, target = self.samples[index]
        return self._item(self.dataset[self._ids[index]], target)

    def __getitems__(self, indices: Sequence[int]) -> List[Tuple[Any, Any]]:
        indices = list(indices)
        data = self.dataset.__getitems__([self._ids[i] for i in indices])
        return [self._item(d, self.samples[i][1]) for d, i in zip(data, indices)]

    def __repr__(self) -> str:
        return (f"granary.torch.ImageFolder({self.root!r}, {len(self)} samples, "
                f"{len(self.classes)} classes)")
