"""Empty class folders: granary.Dataset.directories() lists every directory of
the source tree (empty ones too, with their modes), and granary.torch.ImageFolder
takes its classes from it as torchvision's find_classes does (every top-level
directory, sorted). By default a class folder without any file raises
FileNotFoundError naming it; allow_empty=True keeps it as a class with no
samples, so the other classes keep torchvision's indices."""

import argparse
import os

from granary import Dataset
from granary.torch import ImageFolder, bytes_loader
from granary_test_util import check, expect_raises, torchvision_image_folder


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--empty-classes", required=True, help="comma-separated")
    a = p.parse_args()
    empty_classes = a.empty_classes.split(",")

    # Every directory under the root, as the snapshot walked it.
    expected_dirs = []
    for root, dirs, _ in os.walk(a.source_root):
        for d in dirs:
            full = os.path.join(root, d)
            expected_dirs.append((os.path.relpath(full, a.source_root),
                                  os.stat(full).st_mode & 0o7777))
    expected_dirs.sort(key=lambda e: e[0].encode())
    ds = Dataset(a.dataset)
    got_dirs = ds.directories()
    check(got_dirs == expected_dirs, f"directories() {got_dirs}, expected {expected_dirs}")

    classes, class_to_idx, expected = torchvision_image_folder(a.source_root)
    check(sorted({t for _, t in expected}) != list(range(len(classes))),
          "the tree must have empty classes for this test")

    # Default: torchvision's error, naming exactly the empty classes.
    e = expect_raises(FileNotFoundError, ImageFolder, a.dataset,
                      contains="Found no valid file for the classes "
                      + ", ".join(sorted(empty_classes)))
    check("allow_empty=True" in str(e), f"the error does not say what to do: {e}")
    for c in classes:
        if c not in empty_classes:
            check(f" {c}," not in str(e) and f" {c} " not in str(e), f"{c} named in {e}")

    folder = ImageFolder(a.dataset, allow_empty=True, loader=bytes_loader)
    check(folder.classes == classes, f"classes {folder.classes}, expected {classes}")
    check(folder.class_to_idx == class_to_idx,
          f"class_to_idx {folder.class_to_idx}, expected {class_to_idx}")
    expected = [(f"{a.dataset}/{rel}", t) for rel, t in expected]
    check(folder.samples == expected, f"samples {folder.samples}, expected {expected}")
    for c in empty_classes:
        check(class_to_idx[c] not in folder.targets, f"empty class {c} has samples")
    check(folder.targets == [t for _, t in folder.samples], "targets")
    for i in (0, len(folder) - 1):
        data, target = folder[i]
        path, want = folder.samples[i]
        with open(os.path.join(a.source_root, path.split("/", 1)[1]), "rb") as f:
            check(data == f.read(), f"folder[{i}] bytes are not {path}'s")
        check(target == want, f"folder[{i}] class {target}, expected {want}")
    print(f"ImageFolder with empty classes ok: {classes}, {len(folder)} samples")


if __name__ == "__main__":
    main()
