"""A training script as a user writes it, type-checked with `mypy --strict`
against the installed package (scripts/python-typecheck): the package's hints
and _native.pyi must be enough for it, with no Any leaking into its own
annotations' checks. Not run: only checked."""

from typing import Any, List, Tuple

import torch.utils.data

import granary
from granary.torch import DistributedSampler, ImageFolder, bytes_loader


def first_bytes(ds: granary.Dataset) -> bytes:
    data: bytes = ds.session.read(0)
    return data


def zero_copy_size(name: str) -> int:
    with granary.Dataset(name, zero_copy=True).session.get(1) as s:
        view = memoryview(s)
        size = view.nbytes
        del view
    return size


def train(root: str, epochs: int) -> List[Tuple[int, int]]:
    folder = ImageFolder(root, loader=bytes_loader, is_valid_file=lambda path: True)
    sampler = DistributedSampler(folder, num_replicas=1, rank=0, seed=3)
    loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
        folder, batch_size=8, sampler=sampler)
    seen: List[Tuple[int, int]] = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch, _ in enumerate(loader):
            seen.append((epoch, batch))
        state = sampler.state_dict(consumed=len(sampler))
        sampler.load_state_dict(state)
    classes: List[str] = folder.classes
    print(granary.__version__, len(classes), folder.class_to_idx, folder.targets[:3])
    return seen
