"""A typical small training script, written for torch.utils.data.DataLoader.

The test runs it twice: as is, and with only its import line changed to iolib's.
"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset  # the line the test rewrites


class Points(Dataset):
    def __init__(self, n: int = 512) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        noise = 0.01 * torch.randn(8)  # an augmentation drawing from the global RNG
        return self.x[index] + noise, self.y[index]


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        Points(),
        batch_size=32,
        shuffle=True,
        num_workers=2,
        drop_last=True,
        persistent_workers=True,
        worker_init_fn=lambda worker_id: None,
        generator=torch.Generator().manual_seed(42),
    )
    for epoch in range(3):
        correct = total = 0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
        print(f"epoch {epoch} batches {len(loader)} accuracy {correct / total:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
