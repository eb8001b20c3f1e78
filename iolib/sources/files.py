"""An image folder (``class_name/file.jpg``) on any fsspec filesystem.

Samples are ``{"image": bytes, "label": int, "path": str}``: the encoded bytes, so
decoding happens where it is cheapest (DALI on the GPU, or Pillow), not here.
Labels follow torchvision's ImageFolder: class directories sorted by name.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from typing import Any

import numpy as np
import pyarrow as pa

from iolib.base.redact import Redactor
from iolib.errors import DataError
from iolib.sources.base import Source
from iolib.storage import (
    PERMANENT_ERRORS,
    RetryPolicy,
    call_with_retries,
    count_bytes,
    open_filesystem,
)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
SCHEMA = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("path", pa.string())])


class ImageFolderSource(Source):
    """Images under ``url/<class>/<file>``, read as encoded bytes.

    Example::

        src = ImageFolderSource("file:///data/imagenet/train")
        src.classes[:3], src[0]["label"]

    retry: how transient storage errors are retried (default RetryPolicy()). Credentials
    in the URL or `storage_options` never appear in its messages.
    """

    columnar = True

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.extensions = tuple(e.lower() for e in extensions)
        self._listing: tuple[list[str], list[str], np.ndarray] | None = None
        self._redact = Redactor([url], self.storage_options)
        # Files reached through symbolic links that lead out of the folder: left out and
        # counted, so a link in an image folder cannot pull in, say, a system file.
        self.links_outside = 0

    def _list(self) -> tuple[list[str], list[str], np.ndarray]:
        if self._listing is None:
            fs, root = open_filesystem(self.url, self.storage_options)
            if not fs.exists(root) or not fs.isdir(root):
                raise DataError(
                    f"Image folder {self._redact(self.url)!r} does not exist or is not a directory."
                )
            names = (posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False))
            classes = sorted(
                n for n in names if n not in (".", "..") and fs.isdir(posixpath.join(root, n))
            )
            paths, labels, empty = [], [], []
            inside = _inside_root(fs, root)
            for label, name in enumerate(classes):
                found = sorted(fs.find(posixpath.join(root, name)))
                kept = [p for p in found if p.lower().endswith(self.extensions)]
                outside = [p for p in kept if not inside(p)]
                self.links_outside += len(outside)
                kept = [p for p in kept if inside(p)]
                empty += [] if kept else [name]
                paths += kept
                labels += [label] * len(kept)
            if empty and paths:
                raise DataError(
                    f"Class folder(s) {empty} under {self._redact(self.url)!r} hold no images "
                    f"with extensions {self.extensions}; remove them or add images (labels "
                    "count every folder)."
                )
            if not paths:
                raise DataError(
                    f"Image folder {self._redact(self.url)!r} holds no images: expected "
                    f"<class>/<file> with extensions {self.extensions}."
                )
            self._listing = (classes, paths, np.asarray(labels, dtype=np.int64))
        return self._listing

    @property
    def classes(self) -> list[str]:
        """Class names; a sample's label is its index in this list."""
        return self._list()[0]

    @property
    def paths(self) -> list[str]:
        """Paths of every image, in sample order."""
        return self._list()[1]

    def __len__(self) -> int:
        return len(self._list()[1])

    def fingerprint(self) -> str:
        digest = hashlib.sha256("\n".join(self._list()[1]).encode())
        return digest.hexdigest()[:16]

    def redactor(self) -> Redactor:
        return self._redact

    def describe(self) -> str:
        return f"ImageFolderSource({self._redact(self.url)!r})"

    def locate(self, index: int) -> str:
        return f"{self._redact(self._list()[1][index])!r} (sample {index})"

    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        _, paths, labels = self._list()
        chosen = [paths[int(i)] for i in indices]
        fs, _ = open_filesystem(self.url, self.storage_options)

        def fetch() -> dict[str, bytes]:
            blobs = fs.cat(chosen, on_error="return")
            for value in blobs.values():  # a transient error retries the batch's reads
                if isinstance(value, Exception) and not isinstance(value, PERMANENT_ERRORS):
                    raise value
            return blobs

        blobs = call_with_retries(
            fetch,
            what=f"reading {len(chosen)} images under {self._redact(self.url)!r}",
            policy=self.retry,
            redact=self._redact,
        )
        for path in chosen:
            if isinstance(blobs.get(path), BaseException):
                raise DataError(self._redact(f"Cannot read image {path!r}: {blobs[path]}"))
        images = [blobs[p] for p in chosen]
        count_bytes(sum(len(b) for b in images))
        return pa.table(
            {"image": images, "label": labels[np.asarray(indices, dtype=np.int64)], "path": chosen},
            schema=SCHEMA,
        )


def _inside_root(fs: Any, root: str) -> Any:
    """A test: does a listed path really lie under `root` (links resolved)? Only local
    folders have links to follow; elsewhere every listed path is inside."""
    from fsspec.implementations.local import LocalFileSystem

    if not isinstance(fs, LocalFileSystem):
        return lambda path: True
    real_root = os.path.realpath(root)

    def inside(path: str) -> bool:
        real = os.path.realpath(path)
        return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)

    return inside
