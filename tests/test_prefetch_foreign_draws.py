"""What code that is not torchfeed's draws in a DevicePrefetcher: a torchvision transform (a
``v2.Compose`` a user already has, MixUp) given as its ``transform``, and a plain DataLoader's
reads. Both drew from torch's global generator beside the training loop's thread, in an order
that changed from run to run: the same seeds gave other augmentation, and the loop's own draws
changed with it. torch's random functions called in the prefetcher's thread without a generator
now draw from the batch's (seed, epoch, rank, batch) generator; a DataLoader without workers is
read in the loop's thread."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torchvision.transforms import v2

import torchfeed
from torchfeed._batch_rng import _random_functions, drawing_from

from helpers import Drawing, wait_for_no_threads

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

N, BATCH = 32, 4


class Images(torch.utils.data.Dataset):
    """Image i is a distinct uint8 pattern; its label is i."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        pattern = torch.arange(3 * 12 * 12).reshape(3, 12, 12) * (i + 1) % 251
        return pattern.to(torch.uint8), i


AUGMENT = v2.Compose(
    [v2.RandomResizedCrop(6), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32)]
)
MIXUP = v2.MixUp(num_classes=N)


def augment(batch):
    images, labels = batch
    return MIXUP(AUGMENT(images), labels)


def make_loader(kind: str, workers: int):
    if kind == "plain":
        return torch.utils.data.DataLoader(Images(), batch_size=BATCH, shuffle=True,
                                           num_workers=workers)  # fmt: skip
    return torchfeed.loader(Images(), batch_size=BATCH, shuffle=True, num_workers=workers)


def run(kind="torchfeed", workers=0, pause=0.0, transform=augment, steps=None, state=None):
    """(the batches the loop got, the loop's own torch draws, the loader's state after
    ``steps``)."""
    torch.manual_seed(0)
    loader = make_loader(kind, workers)
    if state is not None:
        loader.load_state_dict(state)
    got, loop, saved = [], [], None
    for k, (images, labels) in enumerate(
        torchfeed.DevicePrefetcher(loader, "cpu", transform=transform), 1
    ):
        got.append((images.flatten()[::5].tolist(), labels.flatten().tolist()))
        time.sleep(pause)  # the prefetcher's thread runs meanwhile
        loop.append(torch.rand(()).item())
        if k == steps:
            saved = loader.state_dict()
            break
    return got, loop, saved


@pytest.mark.parametrize(("kind", "workers"), [("torchfeed", 0), ("plain", 0), ("plain", 2)])
def test_a_torchvision_transform_draws_the_same_for_the_same_seeds(kind, workers):
    first = run(kind, workers, pause=0.002)
    for pause in (0.0, 0.004):
        assert run(kind, workers, pause=pause) == first
    images = [g[0] for g in first[0]]
    assert len({tuple(i) for i in images}) == len(images)  # each batch drew its own
    # the loop's draws are its own: the same as beside a transform that draws nothing
    _, alone, _ = run(kind, workers, transform=lambda batch: (batch[0].float(), batch[1]))
    assert first[1] == alone


def test_ranks_seeded_alike_draw_apart(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    drawn = {}
    for rank in (0, 1, 1):
        monkeypatch.setenv("RANK", str(rank))
        got, _, _ = run("plain")
        assert drawn.setdefault(rank, got) == got
    for b0, b1 in zip(drawn[0], drawn[1], strict=True):
        assert b0[0] != b1[0]  # (the same samples: a plain DataLoader shuffles alike)


def test_a_resumed_run_draws_what_the_uninterrupted_one_drew():
    whole, _, _ = run()
    _, _, state = run(steps=3)
    resumed, _, _ = run(state=state)
    assert resumed == whole[3:]


def test_torch_random_functions_in_the_thread_draw_from_the_batch_generator():
    """Each random function torchvision's transforms (and users' batch transforms) call, without
    a generator: within drawing_from it draws what it draws from the batch's generator; given one
    it keeps it; torch's global generator is left as it was."""
    cases = {
        "rand": lambda **g: torch.rand(3, **g),
        "randn": lambda **g: torch.randn(3, **g),
        "randint": lambda **g: torch.randint(0, 100, (3,), **g),
        "randperm": lambda **g: torch.randperm(6, **g),
        "bernoulli": lambda **g: torch.bernoulli(torch.full((4,), 0.5), **g),
        "multinomial": lambda **g: torch.multinomial(torch.ones(5), 3, **g),
        "normal": lambda **g: torch.normal(torch.zeros(3), torch.ones(3), **g),
        "poisson": lambda **g: torch.poisson(torch.full((3,), 4.0), **g),
        "uniform_": lambda **g: torch.empty(3).uniform_(**g),
        "normal_": lambda **g: torch.empty(3).normal_(**g),
        "random_": lambda **g: torch.empty(3).random_(0, 9, **g),
        "exponential_": lambda **g: torch.empty(3).exponential_(**g),
    }
    if torch.rand_like in _random_functions():  # (its generator= is in newer torch only)
        cases["rand_like"] = lambda **g: torch.rand_like(torch.empty(3), **g)
    for name, draw in cases.items():
        torch.manual_seed(1)
        expected_global = torch.rand(2)
        torch.manual_seed(1)
        with drawing_from(torch.Generator().manual_seed(7)):
            got = draw()
            own = draw(generator=torch.Generator().manual_seed(8))
        assert torch.equal(got, draw(generator=torch.Generator().manual_seed(7))), name
        assert torch.equal(own, draw(generator=torch.Generator().manual_seed(8))), name
        assert torch.equal(torch.rand(2), expected_global), name


def test_another_threads_draws_are_left_to_the_global_generator():
    torch.manual_seed(2)
    expected = torch.rand(4)
    torch.manual_seed(2)
    inside, outside = threading.Event(), threading.Event()
    got = []

    def other():
        inside.wait()
        got.append(torch.rand(4))
        outside.set()

    thread = threading.Thread(target=other)
    thread.start()
    with drawing_from(torch.Generator().manual_seed(3)):
        inside.set()
        outside.wait()
        torch.rand(4)
    thread.join()
    assert torch.equal(got[0], expected)


def test_a_plain_dataloader_without_workers_is_read_in_the_loops_thread():
    def read(pause):
        torch.manual_seed(0)
        data = Drawing(n=64)
        batches, loop = [], []
        loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
        for batch in torchfeed.DevicePrefetcher(loader, "cpu"):
            batches.append(batch.tolist())
            loop.extend(torch.rand(5).tolist())
            time.sleep(pause)
        return batches, loop, data.threads

    first = read(0.002)
    assert first[2] == {threading.main_thread().name}
    for pause in (0.0, 0.004):
        assert read(pause) == first


@pytest.mark.cuda
def test_a_transform_drawing_on_the_gpu_draws_from_a_generator_of_the_batch():
    """torch.rand(device="cuda") and Tensor.uniform_ on a CUDA batch, in the prefetcher's
    thread: the same seeds give the same draws, and the loop's own CUDA draws (dropout's
    generator) are the same as beside a transform that draws nothing."""

    def noisy(batch):
        x = batch.float()
        return x + torch.rand(x.shape, device=x.device) + torch.empty_like(x).uniform_()

    def run_cuda(transform, pause):
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(torch.arange(64.0).reshape(16, 4), batch_size=2,
                                             num_workers=1)  # fmt: skip
        got, loop = [], []
        for batch in torchfeed.DevicePrefetcher(loader, "cuda", transform=transform):
            got.append(batch.cpu())
            time.sleep(pause)
            loop.append(torch.rand(4, device="cuda").cpu())
        return torch.stack(got), torch.stack(loop)

    first = run_cuda(noisy, 0.002)
    again = run_cuda(noisy, 0.0)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert torch.equal(run_cuda(lambda b: b.float(), 0.0)[1], first[1])


def test_another_device_gets_its_batches_copied_and_transformed_in_the_loops_thread():
    """device="mps" (or any device but the CPU and CUDA) handed out CPU batches without a word.
    The batches are now copied there, and transformed there, in the loop's thread (MPS aborts
    the process when two threads run ops at once); "meta" stands in for such a device here."""
    threads = []

    def transform(batch):
        threads.append(threading.current_thread().name)
        images, labels = batch
        assert images.device.type == "meta"
        return images.float() + torch.rand(images.shape, device="meta"), labels

    loader = torch.utils.data.DataLoader(Images(), batch_size=BATCH, num_workers=2)
    out = list(torchfeed.DevicePrefetcher(loader, "meta", transform=transform))
    assert len(out) == N // BATCH
    assert all(x.device.type == "meta" and y.device.type == "meta" for x, y in out)
    assert set(threads) == {threading.main_thread().name}
    plain = list(torchfeed.DevicePrefetcher(loader, "meta"))
    assert all(x.device.type == "meta" and x.dtype == torch.uint8 for x, _ in plain)


def test_another_devices_transform_draws_what_it_drew_in_the_prefetchers_thread():
    """The transform in the loop's thread draws from the batch's generator (the loop's own
    draws stay its own): the same draws as on the CPU, where it runs in the prefetcher's."""

    def drawn(device):
        torch.manual_seed(0)
        loader = torchfeed.loader(Images(), batch_size=BATCH, shuffle=True)
        draws, loop = [], []

        def transform(batch):
            draws.append(torch.rand(3).tolist())
            return batch

        for _ in torchfeed.DevicePrefetcher(loader, device, transform=transform):
            loop.append(torch.rand(()).item())
        return draws, loop

    assert drawn("meta") == drawn("cpu")


def test_another_devices_failing_transform_reaches_the_loop_and_stops_the_thread():
    calls = []

    def failing(batch):  # (a meta tensor has no values: the third call fails)
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("a bad batch")
        return batch

    loader = torch.utils.data.DataLoader(Images(), batch_size=BATCH, num_workers=1)
    got = []
    with pytest.raises(ValueError, match="a bad batch"):
        for _, labels in torchfeed.DevicePrefetcher(loader, "meta", transform=failing):
            got.append(labels.shape[0])
    assert got == [BATCH, BATCH]
    assert wait_for_no_threads()
