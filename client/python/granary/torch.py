"""PyTorch integration: a DistributedSampler whose order Granary knows in
advance, and an ImageFolder over a Granary dataset.

    from granary.torch import DistributedSampler, ImageFolder
    ds = ImageFolder("imagenet", transform=tf, loader=granary.torch.pil_loader)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=256, sampler=sampler,
                                         num_workers=8)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader: ...

docs/client.md describes both, fork/spawn workers and resuming.
"""

import io

import torch.distributed as dist
import torch.utils.data

from . import Dataset, _native, read_file

__all__ = ["DistributedSampler", "ImageFolder", "pil_loader"]

_U64 = (1 << 64) - 1


def _granary_dataset(dataset):
    """The granary.Dataset whose sample ids are `dataset`'s indices, or None."""
    if isinstance(dataset, Dataset):
        return dataset
    if isinstance(dataset, ImageFolder) and dataset.indices_are_sample_ids:
        return dataset.dataset
    return None


class DistributedSampler(torch.utils.data.Sampler):
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
    ``__iter__`` start right after them (later epochs are whole again).
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
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
        self.num_samples, self.total_size = _native.rank_share(len(dataset), self.num_replicas,
                                                               self.drop_last)
        self._resume_at = None  # consumed samples to skip at the next __iter__
        self._yielded = 0       # this epoch's samples handed out by __iter__

    def indices(self, epoch=None):
        """This rank's indices for `epoch` (default: the current one), in order."""
        return _native.rank_samples(len(self.dataset), self.seed & _U64,
                                    self.epoch if epoch is None else epoch, self.num_replicas,
                                    self.rank, self.shuffle, self.drop_last)

    def __iter__(self):
        indices = self.indices()
        start = min(self._resume_at or 0, len(indices))
        self._resume_at = None
        self._yielded = start
        granary_dataset = _granary_dataset(self.dataset)
        if granary_dataset is not None:
            granary_dataset.announce_sampler(self.seed & _U64, self.epoch, self.num_replicas,
                                             self.rank, self.shuffle, self.drop_last, start)
        return self._generate(indices, start)

    def _generate(self, indices, start):
        for position in range(start, len(indices)):
            self._yielded = position + 1
            yield indices[position]

    def __len__(self):
        # The samples the next __iter__ yields: fewer when resuming mid-epoch.
        return self.num_samples - (self._resume_at or 0)

    def set_epoch(self, epoch):
        """Sets the epoch for the next __iter__ (a different order every epoch when shuffling)."""
        self.epoch = epoch

    # ---- resuming --------------------------------------------------------------------

    _STATE_KEYS = ("epoch", "seed", "num_replicas", "rank", "shuffle", "drop_last", "consumed")

    def state_dict(self, consumed=None):
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

    def load_state_dict(self, state):
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


def pil_loader(data):
    """Bytes of an image file → an RGB PIL image (torchvision's default loader)."""
    from PIL import Image  # pylint: disable=import-outside-toplevel
    with Image.open(io.BytesIO(bytes(data))) as image:
        return image.convert("RGB")


def pil_file_loader(path):
    """torchvision's default loader (an RGB PIL image from a path) for files of a
    ``granary mount``: ``torchvision.datasets.ImageFolder(root,
    loader=granary.torch.pil_file_loader)``. It reads with
    :func:`granary.read_file`, so a file in the page cache costs no FUSE
    request (Python's buffered ``open()`` costs one per file before 3.14)."""
    return pil_loader(read_file(path))


class ImageFolder(torch.utils.data.Dataset):
    """torchvision.datasets.ImageFolder (DatasetFolder) over a Granary dataset.

    The dataset's top-level directories are the classes, sorted, as
    torchvision's find_classes lists them: a folder that holds no file is
    still a class (the sidecar lists every directory the snapshot walked), so
    class indices are the ones torchvision gives over the same tree. Every
    file inside a class folder, at any depth, is a sample of that class (no
    extension filter); files directly at the root are skipped.

    A class folder without any file is an error, as in torchvision:
    FileNotFoundError naming the empty classes, unless ``allow_empty=True``,
    which keeps them as classes with no samples.

    ``classes``, ``class_to_idx``, ``samples`` ([(path, class index)]),
    ``targets`` and ``imgs`` are as torchvision builds them, with paths
    relative to the dataset root. An item is ``(sample, class index)``: the
    sample is ``loader(bytes)`` when a loader is given, else the bytes;
    ``transform`` / ``target_transform`` apply to them.

    Samples are in path order (torchvision's order too, except where a class
    name sorts before another that extends it with a character below '/').
    """

    def __init__(self, name, socket=None, transform=None, target_transform=None, loader=None,
                 allow_empty=False):
        self.dataset = name if isinstance(name, Dataset) else Dataset(name, socket=socket)
        self.root = self.dataset.name
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.allow_empty = bool(allow_empty)
        self.classes = sorted(path for path, _ in self.dataset.directories() if "/" not in path)
        if not self.classes:
            raise FileNotFoundError(f"Couldn't find any class folder in granary dataset "
                                    f"{self.dataset.name!r}")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        paths = self.dataset.paths()
        self._ids = [i for i, path in enumerate(paths) if "/" in path]
        self.samples = [(paths[i], self.class_to_idx[paths[i].split("/", 1)[0]])
                        for i in self._ids]
        empty = set(self.classes).difference(paths[i].split("/", 1)[0] for i in self._ids)
        if empty and not self.allow_empty:
            raise FileNotFoundError(
                f"Found no valid file for the classes {', '.join(sorted(empty))} in granary "
                f"dataset {self.dataset.name!r}. Every file in a class folder counts (no "
                f"extension filter); pass allow_empty=True to keep empty class folders as "
                f"classes without samples, or remove them from the source and snapshot it again")
        self.targets = [target for _, target in self.samples]
        self.imgs = self.samples

    @property
    def indices_are_sample_ids(self):
        """True when every sample is in a class folder: index i is sample id i."""
        return len(self._ids) == len(self.dataset)

    def __len__(self):
        return len(self.samples)

    def _item(self, data, target):
        sample = self.loader(data) if self.loader is not None else data
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __getitem__(self, index):
        _, target = self.samples[index]
        return self._item(self.dataset[self._ids[index]], target)

    def __getitems__(self, indices):
        indices = list(indices)
        data = self.dataset.__getitems__([self._ids[i] for i in indices])
        return [self._item(d, self.samples[i][1]) for d, i in zip(data, indices)]

    def __repr__(self):
        return (f"granary.torch.ImageFolder({self.dataset.name!r}, {len(self)} samples, "
                f"{len(self.classes)} classes)")
