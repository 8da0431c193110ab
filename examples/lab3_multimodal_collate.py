"""Lab 3, with torchfeed: a collate_fn for samples of an image, variable-length tokens and a
label.

The course's collate built the attention mask from ``tokens != 0``: wherever 0 is a real token
(a vocabulary's first entry, a byte, a quantized value) the mask hides real data, silently.
``torchfeed.PadCollate`` builds the mask from the lengths, pads every ragged field in one pass
(each with its own pad value), stacks the rest, and can pack instead of padding.
"""

from __future__ import annotations

import torch
from _common import parse, rate
from torch.nn.utils.rnn import pad_sequence

import torchfeed


def course_collate(batch):
    images = torch.stack([s["image"] for s in batch])
    labels = torch.tensor([s["label"] for s in batch])
    tokens = pad_sequence([s["tokens"] for s in batch], batch_first=True, padding_value=0)
    return {"images": images, "tokens": tokens, "mask": tokens != 0, "labels": labels}


def samples(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(8, 129, (1,), generator=g))
        tokens = torch.randint(0, 50, (length,), generator=g)  # 0 is a real token here
        out.append({"image": torch.rand(3, 32, 32, generator=g), "tokens": tokens, "label": i % 5})
    return out


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    batch = samples(64)
    collate = torchfeed.PadCollate({"tokens": 0}, masks={"tokens": "mask"})
    ours, theirs = collate(batch), course_collate(batch)
    real = sum(len(s["tokens"]) for s in batch)
    print(
        f"lab 3: {real} real tokens; the course's mask keeps {int(theirs['mask'].sum())} "
        f"(it hides every real 0), torchfeed's keeps {int(ours['mask'].sum())}"
    )
    assert torch.equal(ours["tokens"], theirs["tokens"])  # the same padding, a correct mask
    repeat = 20 if args.quick else 200
    r_ours = rate(lambda: sum(len(collate(batch)["label"]) for _ in range(repeat)))
    r_theirs = rate(lambda: sum(len(course_collate(batch)["labels"]) for _ in range(repeat)))
    print(
        f"lab 3: {r_ours:,.0f} samples/s collated by torchfeed, {r_theirs:,.0f} by the course's "
        f"collate ({r_ours / r_theirs:.2f}x)"
    )


if __name__ == "__main__":
    main()
