"""The training script examples/Dockerfile.training-image runs: torchvision's
ImageFolder replaced by Granary's (the import and the root change), in a pod
whose sidecar the Granary webhook injected ($GRANARY_SOCKET, $GRANARY_DATASET)."""

import os

import torch
import torchvision.transforms as T

from granary.torch import DistributedSampler, ImageFolder  # was: torchvision.datasets.ImageFolder

transform = T.Compose([T.RandomResizedCrop(224), T.ToTensor()])
dataset = ImageFolder(os.environ["GRANARY_DATASET"], transform=transform)  # was: a directory
sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
loader = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=4)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(len(dataset.classes)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(int(os.environ.get("EPOCHS", "1"))):
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
    print(f"epoch {epoch} done: {len(dataset)} images of {len(dataset.classes)} classes")
