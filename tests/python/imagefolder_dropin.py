"""granary.torch.ImageFolder as a drop-in for torchvision's: the same model
trained through torchvision.datasets.ImageFolder on the files and through
granary's on the dataset, with the same arguments, is the same model.

--make DIR writes the tree (real PNG and JPEG images of three classes, one
nested folder, a file that is not an image, a file at the root) under
DIR/train; then, with the tree registered as a dataset, the comparison runs
with the dataset's name and DIR. Exits 77 (a skip) without torchvision."""

import argparse
import os
import random
import sys

try:
    import torch
    import torchvision
    from PIL import Image
except ImportError as e:
    print(f"skipped: {e} (torchvision and Pillow are in the torch 2.x venv)")
    sys.exit(77)

from granary.torch import ImageFolder
from granary_test_util import check

CLASSES = {"cat": 7, "dog": 5, "emu": 4}


def make(directory):
    rng = random.Random(7)
    train = os.path.join(directory, "train")
    for c, count in CLASSES.items():
        for i in range(count):
            sub = os.path.join(train, c, "more") if i % 3 == 2 else os.path.join(train, c)
            os.makedirs(sub, exist_ok=True)
            size = (rng.randint(8, 24), rng.randint(8, 24))
            mode = "L" if i % 4 == 1 else "RGB"  # the loader converts to RGB
            image = Image.new(mode, size)
            image.putdata([tuple(rng.randrange(256) for _ in mode) if mode == "RGB"
                           else rng.randrange(256) for _ in range(size[0] * size[1])])
            ext = ".png" if i % 2 else ".JPEG"
            image.save(os.path.join(sub, f"{c}_{i:02d}{ext}"))
        with open(os.path.join(train, c, "notes.txt"), "w") as f:
            f.write("not an image: torchvision's extension filter skips it")
    with open(os.path.join(train, "README"), "w") as f:
        f.write("at the root: in no class")


def to_tensor(image):
    """PIL image -> a fixed-size float tensor (what a training transform does)."""
    image = image.resize((8, 8))
    data = torch.tensor(list(image.getdata()), dtype=torch.float32) / 255.0
    return data.reshape(-1)


def train(dataset, workers):
    torch.manual_seed(0)
    model = torch.nn.Linear(8 * 8 * 3, len(CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=workers,
                                         generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return model.weight.detach().clone(), model.bias.detach().clone()


def compare(dataset, directory):
    root = os.path.join(directory, "train")
    theirs = torchvision.datasets.ImageFolder(root)
    ours = ImageFolder(f"{dataset}/train")  # the one line a script changes
    check(ours.classes == theirs.classes, f"classes {ours.classes} vs {theirs.classes}")
    check(ours.class_to_idx == theirs.class_to_idx, "class_to_idx")
    mapped = [(f"{dataset}/train/{os.path.relpath(p, root)}", t) for p, t in theirs.samples]
    check(ours.samples == mapped, f"samples (order and paths) {ours.samples} vs {mapped}")
    check(ours.targets == theirs.targets and ours.imgs == ours.samples, "targets, imgs")
    check(len(ours) == sum(CLASSES.values()), f"{len(ours)} samples: notes.txt must be skipped")
    for i in range(len(ours)):
        (a, ta), (b, tb) = ours[i], theirs[i]
        check(isinstance(a, Image.Image) and a.mode == "RGB", f"item {i} is {type(a)}")
        check(a.size == b.size and a.tobytes() == b.tobytes() and ta == tb,
              f"item {i}: not the same PIL image and class as torchvision's")
        with open(theirs.samples[i][0], "rb") as f:
            check(ours.dataset[ours._ids[i]] == f.read(), f"item {i}: not the file's bytes")
    # Same arguments, same positions: transform, target_transform, is_valid_file.
    only_png = ImageFolder(f"{dataset}/train", to_tensor, lambda t: t * 10, is_valid_file=lambda p:
                           p.endswith(".png"))
    their_png = torchvision.datasets.ImageFolder(root, to_tensor, lambda t: t * 10,
                                                 is_valid_file=lambda p: p.endswith(".png"))
    check(len(only_png) == len(their_png) and all(
        torch.equal(only_png[i][0], their_png[i][0]) and only_png[i][1] == their_png[i][1]
        for i in range(len(only_png))), "is_valid_file, transform, target_transform")
    for workers in (0, 2):
        ours_t = ImageFolder(f"{dataset}/train", transform=to_tensor)
        theirs_t = torchvision.datasets.ImageFolder(root, transform=to_tensor)
        w1, b1 = train(ours_t, workers)
        w2, b2 = train(theirs_t, workers)
        check(torch.equal(w1, w2) and torch.equal(b1, b2),
              f"{workers} workers: the model trained through granary differs from torchvision's")
    print(f"drop-in ok: torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{len(ours)} images, the same model both ways")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--make", metavar="DIR")
    p.add_argument("--dataset")
    p.add_argument("--dir")
    a = p.parse_args()
    if a.make:
        make(a.make)
    else:
        compare(a.dataset, a.dir)


if __name__ == "__main__":
    main()
