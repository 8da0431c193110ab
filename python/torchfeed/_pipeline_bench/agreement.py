"""The pipelines check each other before they are timed: the same images with the same drawn
parameters give the same tensors, so a speedup can never come from doing less work."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from torchfeed._pil import decode_rgb, read_bytes
from torchfeed._pipeline_bench.image_pipelines import (
    MEAN,
    SIZE,
    STD,
    WINDOW_BOUND,
    fused_transform,
)
from torchfeed.decode import DecodeCenterCrop, _reduction, _Source, decode_window
from torchfeed.ops.crop_flip_normalize import crop_flip_normalize
from torchfeed.reference import crop_flip_normalize_torchvision
from torchfeed.sampling import sample_flips, sample_resized_crop_params
from torchfeed.transforms import ResizeCenterCropNormalize

__all__ = ["EVAL_RESIZE", "agreement_of", "check_agreement", "decodable", "evaluation_agreement"]

EVAL_RESIZE = 256  # the evaluation transform: Resize(256) -> CenterCrop(224)


def decodable(files: Sequence[Path], count: int) -> list[tuple[Path, torch.Tensor, torch.Tensor]]:
    """The first ``count`` files that decode: (path, encoded bytes, uint8 image)."""
    out = []
    for f in files:
        encoded = read_bytes(f)
        try:
            out.append((f, encoded, decode_rgb(encoded)))
        except RuntimeError:
            continue  # unreadable: the pipelines skip it too
        if len(out) == count:
            break
    return out


def check_agreement(files: Sequence[Path], count: int = 8) -> dict[str, float]:
    """The same images with the same drawn parameters through torchvision (uint8, the
    baseline's path) and through the fused kernel give the same tensors within 1 level/std, so a
    speedup can never come from doing less work. On the first ``count`` readable files."""
    return agreement_of(decodable(files, count))


def agreement_of(readable: Sequence[tuple[Path, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """:func:`check_agreement` on files already read and decoded (:func:`decodable`)."""
    images = [image for _, _, image in readable]
    g = torch.Generator().manual_seed(0)
    boxes = sample_resized_crop_params([(i.shape[1], i.shape[2]) for i in images], generator=g)
    flips = sample_flips(len(images), 0.5, g)
    ours = crop_flip_normalize(images, boxes, flips, SIZE, mean=MEAN, std=STD)
    theirs = crop_flip_normalize_torchvision(
        images, boxes.tolist(), flips.tolist(), (SIZE, SIZE), MEAN, STD, float_path=False
    )
    diff = float((ours - theirs).abs().max())
    bound = 1.01 / 255 / min(STD) + 1e-4
    if diff > bound:
        raise AssertionError(f"the image pipelines disagree: max |diff| {diff:.5f} > {bound:.5f}")
    # crop-window decoding: the same boxes decoded alone, then resized whole, give the fused
    # kernel's result on the full images (the windows' pixels are identical)
    windows = [decode_window(e, box) for (_, e, _), box in zip(readable, boxes, strict=True)]
    whole = torch.tensor([[0, 0, w.shape[1], w.shape[2]] for w in windows])
    from_windows = crop_flip_normalize(windows, whole, flips, SIZE, mean=MEAN, std=STD)
    window_diff = float((from_windows - ours).abs().max())
    # a fused transform handed the file's bytes decodes only its crop's window: the same draws
    # on the bytes and on the decoded images give the same tensors
    on_bytes, on_images = fused_transform(1), fused_transform(1)
    for _, e, image in readable:
        diff_bytes = float((on_bytes(e) - on_images(image)).abs().max())
        window_diff = max(window_diff, diff_bytes)
    if window_diff > WINDOW_BOUND:
        raise AssertionError(
            "crop-window decoding (or the fused transform on the file's bytes) disagrees with "
            f"full decoding: max |diff| {window_diff:.2e}"
        )
    # reduced-scale decoding: the same boxes at the largest scale keeping SIZE pixels; not the
    # same pixels (another filter), so measured, not bounded: after normalization, in std units
    scaled = [
        decode_window(e, box, size=SIZE) for (_, e, _), box in zip(readable, boxes, strict=True)
    ]
    whole = torch.tensor([[0, 0, w.shape[1], w.shape[2]] for w in scaled])
    from_scaled = crop_flip_normalize(scaled, whole, flips, SIZE, mean=MEAN, std=STD)
    scaled_diff = (from_scaled - ours).abs()
    evaluation = evaluation_agreement(readable)
    return {
        **evaluation,
        "scaled_max_abs_diff": float(scaled_diff.max()),
        "scaled_mean_abs_diff": float(scaled_diff.mean()),
        "scaled_images": sum(
            w.shape[1] < b[2] for w, b in zip(scaled, boxes.tolist(), strict=True)
        ),
        "images": len(images),
        "max_abs_diff": diff,
        "bound": bound,
        "window_max_abs_diff": window_diff,
        "window_bound": WINDOW_BOUND,
    }


def evaluation_agreement(readable: Sequence[tuple[Path, torch.Tensor, torch.Tensor]]) -> dict:
    """The evaluation transform (``Resize(256) -> CenterCrop(224)``, fused) with
    ``reduced_decode=True`` on the files' bytes against the same at full scale on the decoded
    images: measured, not bounded (another filter), in normalized units."""
    exact = ResizeCenterCropNormalize(EVAL_RESIZE, SIZE, mean=MEAN, std=STD)
    reduced = ResizeCenterCropNormalize(EVAL_RESIZE, SIZE, mean=MEAN, std=STD, reduced_decode=True)
    preimage = DecodeCenterCrop(EVAL_RESIZE, SIZE).box
    diffs, count = [], 0
    for _, encoded, image in readable:
        diffs.append((reduced(encoded) - exact(image)).abs())
        # decoded at reduced scale: the decoder's own rule, without decoding the window again
        box = preimage(image.shape[1], image.shape[2])
        count += _Source(encoded).scalable and _reduction(box[2], box[3], (SIZE, SIZE)) > 1
    diff = torch.stack(diffs)
    return {
        "eval_scaled_images": count,
        "eval_scaled_mean_abs_diff": float(diff.mean()),
        "eval_scaled_max_abs_diff": float(diff.max()),
    }
