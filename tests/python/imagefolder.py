"""granary.torch.ImageFolder over class folders, against torchvision's rules
computed from the source tree itself: classes, class_to_idx, samples,
targets; items (bytes or loader(bytes), class index) with transforms; files at
the root skipped; usable with DataLoader and the DistributedSampler."""

import argparse
import os

import torch.utils.data

from granary.torch import DistributedSampler, ImageFolder, bytes_loader
from granary_test_util import check, collate_list, torchvision_image_folder


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--source-root", required=True)
    a = p.parse_args()

    classes, class_to_idx, expected = torchvision_image_folder(a.source_root)

    folder = ImageFolder(a.dataset, loader=bytes_loader)
    check(folder.classes == classes, f"classes {folder.classes}, expected {classes}")
    check(folder.class_to_idx == class_to_idx, "class_to_idx")
    # torchvision's paths (root/class/...) in torchvision's order.
    expected = [(f"{a.dataset}/{rel}", t) for rel, t in expected]
    check(folder.samples == expected, f"samples {folder.samples}, expected {expected}")
    check(folder.targets == [t for _, t in folder.samples], "targets")
    check(len(folder) == len(expected) < len(folder.dataset),
          "files at the root must be skipped")
    check(not folder.indices_are_sample_ids, "indices_are_sample_ids")
    for i in (0, len(folder) // 2, len(folder) - 1, -1):
        data, target = folder[i]
        path, want = folder.samples[i]
        with open(os.path.join(a.source_root, path.split("/", 1)[1]), "rb") as f:
            check(data == f.read(), f"folder[{i}] bytes are not {path}'s")
        check(target == want, f"folder[{i}] class {target}, expected {want}")

    transformed = ImageFolder(a.dataset, transform=len, target_transform=lambda t: t + 100,
                              loader=lambda b: b[::-1])
    data, target = transformed[3]
    path, want = transformed.samples[3]
    with open(os.path.join(a.source_root, path.split("/", 1)[1]), "rb") as f:
        check(data == len(f.read()), "loader then transform")
    check(target == want + 100, "target_transform")
    batch = folder.__getitems__([0, 2])
    check([t for _, t in batch] == [folder.samples[0][1], folder.samples[2][1]], "__getitems__")

    sampler = DistributedSampler(folder, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(folder, batch_size=5, sampler=sampler, num_workers=2,
                                         collate_fn=collate_list)
    got = [t for batch in loader for _, t in batch]
    check(got == [folder.targets[i] for i in sampler.indices()],
          "DataLoader over ImageFolder: targets in the sampler's order")
    print(f"ImageFolder ok: {len(classes)} classes, {len(folder)} samples")


if __name__ == "__main__":
    main()
