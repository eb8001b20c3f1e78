"""The pattern of pytorch/examples imagenet/main.py that deadlocked: a big matmul in the
parent (its intra-op thread pool is then live), a shuffled training loader with two
workers over a torchvision-style image Dataset (PIL, a transform made of torch ops with a
random flip from torch's global RNG), one epoch of a small CNN, then a validation loader
with two workers. Run as a script in a subprocess, once per loader, with a timeout.

Both runs must finish, and the validation must agree exactly: the per-batch losses of the
model's initial weights (the same in both runs: seeded before anything draws) over the
unshuffled validation loader, and the targets it yields. Any difference in the validation
batches (order, composition, decoding, transform) changes those numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

SCRIPT = '''
import copy, json, sys, time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset
{import_line}


class ImageFolderLike(Dataset):
    """Like torchvision.datasets.ImageFolder: root/<class>/<image>.png -> (image, class)."""

    def __init__(self, root, transform):
        classes = sorted(p.name for p in Path(root).iterdir())
        self.samples = [(str(p), classes.index(p.parent.name))
                        for p in sorted(Path(root).glob("*/*.png"))]
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        with open(path, "rb") as f:
            image = Image.open(f).convert("RGB")
        return self.transform(image), target


class ToTensor:
    def __call__(self, image):
        data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        return data.view(image.height, image.width, 3).permute(2, 0, 1).float().div(255)


class RandomHorizontalFlip:
    def __call__(self, tensor):
        return tensor.flip(-1) if torch.rand(1).item() < 0.5 else tensor


class Normalize:
    def __call__(self, tensor):
        return (tensor - 0.5) / 0.25


class Compose:
    def __init__(self, steps):
        self.steps = steps

    def __call__(self, x):
        for step in self.steps:
            x = step(x)
        return x


class SmallCNN(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = F.avg_pool2d(x, 4)  # 128x128 -> 32x32: the model stays cheap
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def validate(model, loader):
    model.eval()
    losses, targets = [], []
    with torch.no_grad():
        for images, target in loader:
            losses.append(F.cross_entropy(model(images), target, reduction="sum").item())
            targets.extend(target.tolist())
    return losses, targets


def main():
    start = time.monotonic()
    root = Path(sys.argv[1])
    torch.manual_seed(0)
    model = SmallCNN(classes=4)
    initial = copy.deepcopy(model.state_dict())
    a = torch.randn(1500, 1500)
    a @ a  # the parent's thread pool is live before the workers fork
    train_set = ImageFolderLike(root / "train",
                                Compose([ToTensor(), RandomHorizontalFlip(), Normalize()]))
    val_set = ImageFolderLike(root / "val", Compose([ToTensor(), Normalize()]))
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True, num_workers=2)
    val_loader = DataLoader(val_set, batch_size=16, shuffle=False, num_workers=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    train_batches, train_losses = 0, []
    for images, target in train_loader:
        loss = F.cross_entropy(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_batches += 1
        train_losses.append(loss.item())
        print(f"train batch {{train_batches}} at {{time.monotonic() - start:.1f}} s", flush=True)
    print(f"validating at {{time.monotonic() - start:.1f}} s", flush=True)
    trained_losses, _ = validate(model, val_loader)
    model.load_state_dict(initial)
    initial_losses, targets = validate(model, val_loader)
    print("RESULT " + json.dumps({{
        "train_batches": train_batches,
        "train_losses_finite": all(l == l and abs(l) < 1e6 for l in train_losses),
        "trained_val_loss": sum(trained_losses),
        "initial_val_losses": initial_losses,
        "val_targets": targets,
        "seconds": time.monotonic() - start,
    }}))


if __name__ == "__main__":
    main()
'''

IMPORTS = {
    "torch": "from torch.utils.data import DataLoader",
    "iolib": "from iolib import DataLoader",
}
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    """4 classes of 128x128 PNGs (lossless: decoding is exact): 24 per class to train,
    8 per class to validate. 128x128x3 values are above torch's grain size for intra-op
    parallelism (32768), so the transform's torch ops run parallel regions in the worker
    processes: the ones that deadlocked after fork when the parent's pool was live."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 24), ("val", 8)):
        for c in range(4):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                base = np.zeros((128, 128, 3), dtype=np.uint8)
                base[..., c % 3] = 60 * (c + 1)
                pixels = np.clip(base + rng.integers(0, 90, base.shape), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"img{i:03d}.png")
    return root


def run_script(which: str, root: Path, workdir: Path) -> dict:
    script = workdir / f"train_{which}.py"
    script.write_text(SCRIPT.format(import_line=IMPORTS[which]))
    path = os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])
    log = workdir / f"train_{which}.log"
    with open(log, "w") as out:
        # Own session: on a timeout the script and the workers it forked are killed
        # together (by its process group), so a deadlocked run leaves nothing behind.
        proc = subprocess.Popen(
            [sys.executable, str(script), str(root)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            pytest.fail(
                f"{which}: the training script did not finish in {TIMEOUT_S} s "
                f"(deadlock?); its output:\n{log.read_text()[-2000:]}"
            )
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert code == 0, f"{which}: exit {code}\n{output[-3000:]}"
    line = next(x for x in output.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.fixture(scope="module")
def torch_result(image_root, tmp_path_factory) -> dict:
    return run_script("torch", image_root, tmp_path_factory.mktemp("torch_run"))


def test_imagenet_pattern_finishes_and_validates_like_torch(
    Loader, image_root, torch_result, tmp_path
) -> None:
    which = "torch" if Loader is torch.utils.data.DataLoader else "iolib"
    result = torch_result if which == "torch" else run_script(which, image_root, tmp_path)
    assert result["train_batches"] == 6  # 96 images, batch 16
    assert result["train_losses_finite"]
    assert result["val_targets"] == torch_result["val_targets"]
    assert len(result["initial_val_losses"]) == 2
    assert result["initial_val_losses"] == torch_result["initial_val_losses"]
