"""The ragged-token workload of ``torchfeed bench``: static padding to 512 and dynamic padding
with pad_sequence (the usual practice) against PadCollate (padded and packed)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from torchfeed._pipeline_bench.runner import PipelineResult, run_bracketed, run_epochs
from torchfeed.collate import PadCollate
from torchfeed.loaders import loader
from torchfeed.ragged import RaggedBatch

__all__ = ["BASELINE", "PIPELINES", "TokenDataset", "check_pipelines_agree", "run"]

MAX_LENGTH = 512


class TokenDataset(Dataset):
    """Token sequences with a long-tailed length distribution in [8, 512] (most short, a few
    long, as tokenized text is), generated deterministically."""

    def __init__(self, size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.exp(torch.randn(size, generator=g) * 0.8 + 4.6).clamp(8, MAX_LENGTH)
        self.sequences = [
            torch.randint(1, 32000, (int(n),), generator=g) for n in lengths.round().long()
        ]

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, i: int) -> dict[str, Any]:
        tokens = self.sequences[i]
        return {"input_ids": tokens, "labels": tokens, "label": i % 7}


def _masked(tokens: list[torch.Tensor], length: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    padded = pad_sequence(tokens, batch_first=True, padding_value=0)
    if length is not None:
        padded = F.pad(padded, (0, length - padded.shape[1]), value=0)
    lengths = torch.tensor([t.shape[0] for t in tokens])
    return padded, torch.arange(padded.shape[1]) < lengths[:, None]


def _handwritten(batch, length: int | None):
    ids, mask = _masked([b["input_ids"] for b in batch], length)
    labels, _ = _masked([b["labels"] for b in batch], length)
    labels[~mask] = -100
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "label": torch.tensor([b["label"] for b in batch]),
    }


def static_collate(batch):
    """The tokenizer's padding="max_length": every batch padded to 512 with pad_sequence."""
    return _handwritten(batch, MAX_LENGTH)


def dynamic_collate(batch):
    """Hand-written dynamic padding: pad_sequence to the batch maximum, mask from lengths."""
    return _handwritten(batch, None)


def torchfeed_collate(packed: bool = False) -> PadCollate:
    if packed:
        return PadCollate(["input_ids", "labels"], packed=True)
    return PadCollate(
        {"input_ids": 0, "labels": -100},
        masks={"input_ids": "attention_mask", "labels": None},
        lengths={"input_ids": None, "labels": None},
    )


PIPELINES = {
    "text: static pad to 512 (pad_sequence)": static_collate,
    "text: dynamic pad (pad_sequence)": dynamic_collate,
    "text: torchfeed PadCollate": torchfeed_collate(),
    "text: torchfeed PadCollate packed": torchfeed_collate(packed=True),
}
ZERO_COPY = "text: torchfeed PadCollate zero-copy"
BASELINE = "text: static pad to 512 (pad_sequence)"


def check_pipelines_agree(dataset: TokenDataset, batch_size: int) -> None:
    """Same samples in, same real tokens out: a speedup can never come from doing less."""
    batch = [dataset[i] for i in range(min(batch_size, len(dataset)))]
    static = static_collate(batch)
    dynamic = dynamic_collate(batch)
    ours = torchfeed_collate()(batch)
    packed = torchfeed_collate(packed=True)(batch)
    width = dynamic["input_ids"].shape[1]
    for key in ("input_ids", "attention_mask", "labels"):
        if not torch.equal(ours[key], dynamic[key]) or not torch.equal(
            static[key][:, :width], dynamic[key]
        ):
            raise AssertionError(f"text pipelines disagree on {key!r}")
    if not torch.equal(packed["input_ids"].values, dynamic["input_ids"][dynamic["attention_mask"]]):
        raise AssertionError("packed text pipeline disagrees with the padded ones")


def _tokens(batch) -> tuple[int, int]:
    ids = batch["input_ids"]
    if isinstance(ids, RaggedBatch):
        return ids.values.shape[0], ids.values.shape[0]
    return int(batch["attention_mask"].sum()), ids.numel()


def run(
    *, size: int, batch_size: int, workers: list[int], epochs: int, show_progress: bool
) -> list[PipelineResult]:
    dataset = TokenDataset(size)
    check_pipelines_agree(dataset, batch_size)
    results = []
    for num_workers in workers:
        pipelines = dict(PIPELINES)
        if num_workers > 0:
            pipelines[ZERO_COPY] = None  # made below, with its ring
        config = f"workers={num_workers}"

        def timed(name: str, pipelines=pipelines, num_workers=num_workers, config=config):
            collate = pipelines[name]
            counts = {"real": 0, "padded": 0}

            def consume(batch):
                real, padded = _tokens(batch)
                counts["real"] += real
                counts["padded"] += padded
                return batch["label"].shape[0]

            def make_loader():
                if name == ZERO_COPY:
                    return loader(
                        dataset,
                        zero_copy=True,
                        batch_size=batch_size,
                        shuffle=False,
                        num_workers=num_workers,
                        persistent_workers=True,
                        collate_fn=torchfeed_collate(),
                    )
                return DataLoader(
                    dataset,
                    batch_size=batch_size,
                    shuffle=False,
                    num_workers=num_workers,
                    collate_fn=collate,
                    persistent_workers=num_workers > 0,
                )

            result = run_epochs(
                name,
                config,
                make_loader,
                consume,
                epochs,
                -(-len(dataset) // batch_size),
                show_progress,
            )
            result.extra["tokens_kept_pct"] = 100.0 * counts["real"] / max(counts["padded"], 1)
            return result

        results += run_bracketed(pipelines, timed, BASELINE)
    return results
