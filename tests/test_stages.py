"""Pipeline-parallel stage loaders: roles, microbatches, what each stage reads and decodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from iolib import DataLoader
from iolib.errors import ConfigError
from iolib.loader.distributed import PipelineRank, pipeline_rank
from iolib.loader.stages import microbatch_sizes, split_batch
from iolib.loader.testing import epoch_batches
from iolib.sources import ImageFolderSource, ParquetSource


def tokens_loader(token_dir: Path, **kwargs) -> DataLoader:
    options = dict(batch_size=10, shuffle=True, seed=3)
    return DataLoader(ParquetSource(str(token_dir)), **{**options, **kwargs})


def joined(microbatches: list, key: str) -> torch.Tensor:
    return torch.cat([mb[key] for mb in microbatches])


class TokensDecoder:
    """A stand-in decoder that consumes the `tokens` column and counts its calls."""

    columns = ("tokens",)
    on_error = "raise"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch: dict, indices: np.ndarray, *, seed: int, epoch: int):
        self.calls += 1
        return {**batch, "tokens": batch["tokens"].float() / 2}, []


class CountingDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        self.reads += 1
        return torch.tensor([float(index)]), index % 3


def test_microbatch_sizes_follow_tensor_split() -> None:
    for rows in range(1, 12):
        for parts in range(1, rows + 1):
            expected = [len(p) for p in torch.tensor_split(torch.arange(rows), parts)]
            assert microbatch_sizes(rows, parts) == expected
    assert microbatch_sizes(2, 4) == [1, 1]  # a short last batch: no empty microbatch


def test_split_batch_splits_tensors_lists_and_nesting_alike() -> None:
    batch = {"x": torch.arange(5), "names": list("abcde"), "pair": (torch.ones(5), [0] * 5)}
    parts = split_batch(batch, [3, 2])
    assert parts[0]["x"].tolist() == [0, 1, 2] and parts[1]["names"] == ["d", "e"]
    assert parts[1]["pair"][0].shape == (2,) and parts[0]["pair"][1] == [0, 0, 0]
    with pytest.raises(ConfigError, match="Cannot split a str"):
        split_batch("abc", [1, 2])


def test_first_stage_gets_inputs_last_gets_labels_in_order(token_dir) -> None:
    full = epoch_batches(tokens_loader(token_dir))
    first = list(tokens_loader(token_dir).for_stage(0, 2, microbatches=3))
    last = list(tokens_loader(token_dir).for_stage(1, 2, microbatches=3))
    assert len(first) == len(last) == len(full) == 10
    for k, batch in enumerate(full):
        assert [set(mb) for mb in first[k]] == [{"id", "tokens"}] * 3
        assert [set(mb) for mb in last[k]] == [{"label"}] * 3
        assert [len(mb["id"]) for mb in first[k]] == [4, 3, 3]
        assert joined(first[k], "id").tolist() == batch["id"].tolist()
        assert joined(first[k], "tokens").numpy().tobytes() == batch["tokens"].tobytes()
        assert joined(last[k], "label").tolist() == batch["label"].tolist()


def test_middle_stage_gets_none_and_reads_nothing(token_dir) -> None:
    feed = tokens_loader(token_dir).for_stage(1, 3, microbatches=2)
    batches = list(feed)
    assert len(batches) == 10 and all(mbs == [None, None] for mbs in batches)
    stats = feed.stats()
    assert stats["bytes_read"] == 0 and stats["stage"]["reads"] == "nothing"


def test_single_stage_gets_everything(token_dir) -> None:
    full = epoch_batches(tokens_loader(token_dir))
    only = list(tokens_loader(token_dir).for_stage(0, 1, microbatches=2))
    assert [set(mb) for mb in only[0]] == [{"id", "label", "tokens"}] * 2
    assert joined(only[3], "label").tolist() == full[3]["label"].tolist()


def test_label_stage_reads_only_the_label_column(token_dir) -> None:
    whole, first, last = (
        tokens_loader(token_dir),
        tokens_loader(token_dir).for_stage(0, 2),
        tokens_loader(token_dir).for_stage(1, 2),
    )
    for feed in (whole, first, last):
        for _ in feed:
            pass
    read = [feed.stats()["bytes_read"] for feed in (whole, first, last)]
    # The two stages' columns partition the dataset's: their reads add up to at least a
    # full read (each counts the bytes it fetched, a gap between its columns included).
    assert 0 < read[2] < read[1] <= read[0] <= read[1] + read[2]
    assert last.stats()["stage"]["columns"] == ["label"]


def test_stage_without_the_decoders_column_does_not_decode(token_dir) -> None:
    decoder = TokensDecoder()
    first = tokens_loader(token_dir, decode=decoder).for_stage(0, 2)
    last = tokens_loader(token_dir, decode=decoder).for_stage(1, 2)
    assert list(last) and decoder.calls == 0 and last.stats()["stage"]["decodes"] is False
    got = list(first)
    assert decoder.calls == len(got) and got[0][0]["tokens"].dtype == torch.float32


def test_image_folder_label_stage_fetches_no_image(image_folder) -> None:
    def make() -> DataLoader:
        return DataLoader(ImageFolderSource(str(image_folder)), batch_size=4, shuffle=True)

    full = epoch_batches(make())
    first, last = make().for_stage(0, 2), make().for_stage(1, 2)
    inputs, labels = list(first), list(last)
    assert set(inputs[0][0]) == {"image", "path"} and set(labels[0][0]) == {"label"}
    assert [mbs[0]["label"].tolist() for mbs in labels] == [b["label"].tolist() for b in full]
    assert last.stats()["bytes_read"] == 0 < first.stats()["bytes_read"]


def test_tuple_batches_first_gets_x_last_gets_y() -> None:
    x, y = torch.arange(24.0).view(12, 2), torch.arange(12) % 5

    def make():
        return DataLoader(TensorDataset(x, y), batch_size=6, shuffle=True, seed=1)

    full = list(make())
    first = list(make().for_stage(0, 2, microbatches=2))
    last = list(make().for_stage(1, 2, microbatches=2))
    for batch, xs, ys in zip(full, first, last, strict=True):
        assert torch.equal(torch.cat(xs), batch[0]) and torch.equal(torch.cat(ys), batch[1])
    both = list(make().for_stage(0, 1, microbatches=3))
    assert isinstance(both[0][0], tuple) and both[0][0][0].shape == (2, 2)


def test_middle_stage_of_a_torch_dataset_calls_getitem_never() -> None:
    dataset = CountingDataset(20)
    loader = DataLoader(dataset, batch_size=5, num_workers=0)
    assert list(loader.for_stage(1, 3)) == [[None]] * 4
    assert dataset.reads == 0


def test_columns_labels_and_inputs_are_configurable(token_dir) -> None:
    middle = tokens_loader(token_dir).for_stage(1, 3, columns=["id"])
    assert [set(mb) for mb in next(iter(middle))] == [{"id"}]
    last = tokens_loader(token_dir).for_stage(1, 2, labels=["label", "id"])
    assert set(next(iter(last))[0]) == {"label", "id"}
    first = tokens_loader(token_dir).for_stage(0, 2, inputs="tokens")
    assert set(next(iter(first))[0]) == {"tokens"}
    assert first.stats()["stage"]["reads"] == "projected"


def test_a_transform_keeps_every_column_read_but_selects(token_dir) -> None:
    def add(sample, rng):
        return {**sample, "noise": float(rng.random())}

    last = tokens_loader(token_dir, transform=add).for_stage(1, 2)
    assert set(next(iter(last))[0]) == {"label"} and last.stats()["stage"]["reads"] == "all"


def test_skipping_errors_makes_every_stage_read_everything(token_dir) -> None:
    last = tokens_loader(token_dir, on_error="skip").for_stage(1, 2)
    decoder = TokensDecoder()
    decoder.on_error = "skip"
    decoded = tokens_loader(token_dir, decode=decoder).for_stage(1, 2)
    for feed in (last, decoded):
        assert set(next(iter(feed))[0]) == {"label"}
        assert feed.stats()["stage"]["reads"] == "all"
    assert decoder.calls == 1


def test_stage_feed_state_roundtrip_and_interchange(token_dir) -> None:
    reference = [joined(mbs, "label").tolist() for mbs in tokens_loader(token_dir).for_stage(1, 2)]
    feed = tokens_loader(token_dir).for_stage(1, 2, microbatches=2)
    iterator = iter(feed)
    head = [joined(next(iterator), "label").tolist() for _ in range(4)]
    state = json.loads(json.dumps(feed.state_dict()))
    assert state["position"] == 40
    resumed = tokens_loader(token_dir).for_stage(1, 2, microbatches=2)
    resumed.load_state_dict(state)
    tail = [joined(mbs, "label").tolist() for mbs in resumed]
    assert head + tail == reference
    whole = tokens_loader(token_dir)  # a projected stage's state fits the full loader
    whole.load_state_dict(state)
    assert [b["label"].tolist() for b in whole] == reference[4:]
    feed.set_epoch(1)
    assert feed.epoch == 1 and len(feed) == 10


def test_bad_arguments_are_named(token_dir) -> None:
    loader = tokens_loader(token_dir)
    with pytest.raises(ConfigError, match="exceeds batch_size"):
        loader.for_stage(0, 2, microbatches=11)
    with pytest.raises(ConfigError, match=r"`stage` must be in 0\.\.1"):
        loader.for_stage(2, 2)
    with pytest.raises(ConfigError, match="`labels` \\['target'\\] are not in the batch"):
        next(iter(loader.for_stage(1, 2, labels="target")))
    unlabeled = DataLoader(ParquetSource(str(token_dir), columns=["id", "tokens"]), batch_size=4)
    with pytest.raises(ConfigError, match="No label column"):
        next(iter(unlabeled.for_stage(1, 2)))


def test_pipeline_rank_layout() -> None:
    assert pipeline_rank(2, rank=5, world_size=8) == PipelineRank(1, 2, 4)
    assert pipeline_rank(1, rank=0, world_size=1) == PipelineRank(0, 0, 1)
    with pytest.raises(ConfigError, match="multiple of `num_stages`"):
        pipeline_rank(2, rank=0, world_size=3)
