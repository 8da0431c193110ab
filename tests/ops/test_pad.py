"""torchfeed.pad / pad_packed and the torchfeed::pad_* ops against independent references."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence

import torchfeed
import torchfeed.ops._dispatch as dispatch
import torchfeed.ops._pad as pad_module
from torchfeed import reference

from helpers import ALL_DTYPES, DEVICES, assert_bits_equal, random_values


def sample_sequences(device: str, dtype: torch.dtype):
    """(name, sequences): odd sizes, empty rows, N-D rows, non-contiguous rows."""
    g = torch.Generator().manual_seed(0)

    def rv(*shape):
        return random_values(shape, dtype, g).to(device)

    yield "odd_lengths", [rv(n) for n in (3, 7, 1, 5)]
    yield "zero_length_inside", [rv(0), rv(4), rv(0), rv(2)]
    yield "all_zero_length", [rv(0), rv(0)]
    yield "single", [rv(1)]
    yield "nd_rows", [rv(n, 2, 3) for n in (2, 5, 0)]
    yield "empty_feature", [rv(n, 0) for n in (2, 3)]
    yield "non_contiguous", [rv(3, n).t() for n in (4, 1, 6)]
    yield "strided_slices", [rv(2 * n)[::2] for n in (5, 2)]


OPTIONS = [
    dict(padding_side=p, truncation_side=t, max_length=m, pad_to_multiple_of=k)
    for p, t, m, k in itertools.product(
        ("right", "left"), ("right", "left"), (None, 1, 3), (None, 4)
    )
]


def expected(seqs, pad_value, padding_side, truncation_side, max_length, pad_to_multiple_of):
    length = pad_module.padded_length((s.shape[0] for s in seqs), max_length, pad_to_multiple_of)
    return reference.pad_sequences(
        [s.cpu() for s in seqs],
        length,
        pad_value,
        padding_side == "left",
        max_length,
        truncation_side == "left",
    )


def check_against_reference(out, seqs, pad_value, **options):
    want = expected(seqs, pad_value, **options)
    assert_bits_equal(out.padded, want[0])
    assert torch.equal(out.mask.cpu(), want[1])
    assert torch.equal(out.lengths.cpu(), want[2])
    assert out.padded.is_contiguous()
    assert out.padded.device == seqs[0].device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_matches_loop_reference(device, dtype):
    pad_value = True if dtype == torch.bool else 7
    for _, seqs in sample_sequences(device, dtype):
        for options in OPTIONS:
            out = torchfeed.pad(seqs, pad_value=pad_value, **options)
            check_against_reference(out, seqs, pad_value, **options)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool], ids=str)
def test_matches_pad_sequence(device, padding_side, dtype):
    for _, seqs in sample_sequences(device, dtype):
        out = torchfeed.pad(seqs, pad_value=0, padding_side=padding_side)
        want = pad_sequence(seqs, batch_first=True, padding_value=0, padding_side=padding_side)
        assert torch.equal(out.padded, want)
        lengths = torch.tensor([s.shape[0] for s in seqs], device=device)
        positions = torch.arange(out.padded.shape[1], device=device)
        if padding_side == "right":
            want_mask = positions < lengths[:, None]
        else:
            want_mask = positions >= out.padded.shape[1] - lengths[:, None]
        assert torch.equal(out.mask, want_mask)
        assert torch.equal(out.lengths, lengths)


def test_mask_comes_from_lengths_not_from_pad_value():
    # The pad id occurs inside real data: a `tokens != pad_id` mask would be wrong here.
    seqs = [torch.tensor([0, 5, 0]), torch.tensor([0]), torch.tensor([4, 0, 0, 0])]
    out = torchfeed.pad(seqs, pad_value=0)
    assert out.mask.tolist() == [
        [True, True, True, False],
        [True, False, False, False],
        [True, True, True, True],
    ]
    assert out.lengths.tolist() == [3, 1, 4]


def test_truncation_and_multiple_rules():
    seqs = [torch.arange(10), torch.arange(3)]
    out = torchfeed.pad(seqs, max_length=6, pad_to_multiple_of=4, pad_value=-1)
    assert out.padded.shape == (2, 8)  # 6 kept, rounded up to 8
    assert out.padded[0].tolist() == [0, 1, 2, 3, 4, 5, -1, -1]
    out = torchfeed.pad(seqs, max_length=6, truncation_side="left", padding_side="left")
    assert out.padded.shape == (2, 6)
    assert out.padded[0].tolist() == [4, 5, 6, 7, 8, 9]
    assert out.padded[1].tolist() == [0, 0, 0, 0, 1, 2]
    assert out.lengths.tolist() == [6, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_pad_packed_matches_list_form(device):
    for dtype in (torch.int64, torch.float16, torch.bool):
        for _, seqs in sample_sequences(device, dtype):
            values = torch.cat(seqs)
            offsets = torch.tensor(
                [0, *itertools.accumulate(s.shape[0] for s in seqs)], device=device
            )
            for options in OPTIONS[::3]:
                packed = torchfeed.pad_packed(values, offsets, pad_value=1, **options)
                listed = torchfeed.pad(seqs, pad_value=1, **options)
                for a, b in zip(packed, listed, strict=True):
                    assert_bits_equal(a, b)


def test_pad_packed_empty_batch():
    values = torch.empty(0, 3)
    out = torchfeed.pad_packed(values, torch.zeros(1, dtype=torch.int64))
    assert out.padded.shape == (0, 0, 3)
    assert out.mask.shape == (0, 0)
    assert out.lengths.shape == (0,)


def test_input_is_not_modified():
    seqs = [torch.arange(4), torch.arange(2)]
    before = [s.clone() for s in seqs]
    torchfeed.pad(seqs, pad_value=-1, max_length=3)
    for s, b in zip(seqs, before, strict=True):
        assert torch.equal(s, b)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    feat=st.lists(st.integers(0, 3), max_size=2),
    padding_side=st.sampled_from(["right", "left"]),
    truncation_side=st.sampled_from(["right", "left"]),
    max_length=st.none() | st.integers(1, 50),
    multiple=st.none() | st.integers(1, 16),
    pad_value=st.integers(-5, 5),
)
def test_properties(lengths, feat, padding_side, truncation_side, max_length, multiple, pad_value):
    seqs = [torch.randint(-5, 5, (n, *feat)) for n in lengths]
    out = torchfeed.pad(
        seqs,
        pad_value=pad_value,
        padding_side=padding_side,
        truncation_side=truncation_side,
        max_length=max_length,
        pad_to_multiple_of=multiple,
    )
    kept = [n if max_length is None else min(n, max_length) for n in lengths]
    # lengths preserved (after truncation)
    assert out.lengths.tolist() == kept
    # L: the longest kept length, rounded up to the multiple, and no longer
    length = out.padded.shape[1]
    assert length >= max(kept)
    if multiple is not None:
        assert length % multiple == 0 and length < max(kept) + multiple
    else:
        assert length == max(kept)
    # round trip: the real elements come back through the mask, in order
    pieces = [
        s[n - k :] if truncation_side == "left" else s[:k]
        for s, n, k in zip(seqs, lengths, kept, strict=True)
    ]
    assert torch.equal(out.padded[out.mask], torch.cat(pieces))
    # everything else is the pad value
    assert bool((out.padded[~out.mask] == pad_value).all())
    # the mask is a contiguous run at the padding side
    for row, k in zip(out.mask, kept, strict=True):
        idx = row.nonzero().flatten()
        if k:
            assert idx.tolist() == list(range(idx[0], idx[0] + k))
            assert (idx[0] == 0) if padding_side == "right" else (idx[-1] == length - 1)


def op_samples(device):
    for dtype in (torch.int64, torch.float32, torch.bool, torch.bfloat16):
        for name, seqs in sample_sequences(device, dtype):
            length = max(s.shape[0] for s in seqs) + 1
            values = torch.cat(seqs)
            offsets = torch.tensor(
                [0, *itertools.accumulate(s.shape[0] for s in seqs)], device=device
            )
            yield name, seqs, values, offsets, length


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for _, seqs, values, offsets, length in op_samples(device):
        torch.library.opcheck(
            torch.ops.torchfeed.pad_packed.default, (values, offsets, length, 1, True, 2, True)
        )
        torch.library.opcheck(
            torch.ops.torchfeed.pad_list.default, (seqs, length, 0, False, -1, False)
        )
        # length=-1: the kernel finds the longest kept length, rounded up to `multiple`
        for args in ((0, False, -1, False, 1), (1, True, 3, True, 4)):
            torch.library.opcheck(torch.ops.torchfeed.pad_list.default, (seqs, -1, *args))


def test_list_op_finds_the_length_itself():
    seqs = [torch.arange(n) for n in (5, 0, 9, 2)]
    for max_length, multiple, expected in ((-1, 1, 9), (4, 1, 4), (-1, 4, 12), (6, 4, 8)):
        padded, mask, lengths = torch.ops.torchfeed.pad_list(
            seqs, -1, 0, False, max_length, False, multiple
        )
        assert padded.shape == (4, expected)
        ref = torchfeed.pad(
            seqs,
            max_length=None if max_length < 0 else max_length,
            pad_to_multiple_of=None if multiple == 1 else multiple,
        )
        assert torch.equal(padded, ref.padded) and torch.equal(mask, ref.mask)
        assert torch.equal(lengths, ref.lengths)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    def fn(seqs):
        out = torchfeed.pad(seqs, pad_value=-1, padding_side="left", pad_to_multiple_of=8)
        return out.padded * 2, out.mask, out.lengths

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for n in ((3, 5, 2), (7, 1)):
        seqs = [torch.arange(k, device=device) for k in n]
        for a, b in zip(compiled(seqs), fn(seqs), strict=True):
            assert torch.equal(a, b)

    def packed(values, offsets):
        return torch.ops.torchfeed.pad_packed(values, offsets, 6, 0, False, -1, False)

    values = torch.arange(9, device=device)
    offsets = torch.tensor([0, 4, 4, 9], device=device)
    got = torch.compile(packed, fullgraph=True, backend="aot_eager")(values, offsets)
    for a, b in zip(got, packed(values, offsets), strict=True):
        assert torch.equal(a, b)


def test_meta_tensors_give_shapes():
    seqs = [torch.empty(n, 4, device="meta") for n in (2, 9)]
    out = torchfeed.pad(seqs, pad_to_multiple_of=8)
    assert out.padded.shape == (2, 16, 4) and out.mask.shape == (2, 16)


@pytest.fixture
def no_kernels(monkeypatch):
    monkeypatch.setattr(pad_module, "has_kernel", lambda op, device_type: False)
    monkeypatch.setattr(pad_module, "warn_fallback", lambda *args: None)


def test_reference_fallback_matches_kernels(no_kernels):
    for _, seqs in sample_sequences("cpu", torch.int32):
        for options in OPTIONS[::5]:
            out = torchfeed.pad(seqs, pad_value=3, **options)
            check_against_reference(out, seqs, 3, **options)


def test_fallback_warns_once_per_device(monkeypatch):
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(pad_module, "has_kernel", lambda op, device_type: False)
    with pytest.warns(RuntimeWarning, match="no compiled kernel for cpu tensors"):
        torchfeed.pad([torch.arange(3)])
    torchfeed.pad([torch.arange(3)])  # a second call does not warn (warnings are errors here)


BAD_LISTS = [
    ([], ValueError, "sequences must hold at least one tensor"),
    ([torch.arange(3), torch.arange(3.0)], TypeError, r"sequences\[1\] has dtype"),
    ([torch.ones(2, 3), torch.ones(2, 4)], ValueError, r"sequences\[1\] has trailing dims"),
    ([torch.arange(3), [1, 2]], TypeError, r"sequences\[1\] must be a tensor, got list"),
    ([torch.tensor(1)], ValueError, r"sequences\[0\] must have at least one dimension"),
]


@pytest.mark.parametrize("path", ["kernel", "reference"])
@pytest.mark.parametrize(("seqs", "error", "match"), BAD_LISTS)
def test_bad_sequences(path, seqs, error, match, monkeypatch):
    if path == "reference":
        monkeypatch.setattr(pad_module, "has_kernel", lambda op, device_type: False)
        monkeypatch.setattr(pad_module, "warn_fallback", lambda *args: None)
    with pytest.raises(error, match=match):
        torchfeed.pad(seqs)


@pytest.mark.parametrize("path", ["kernel", "reference"])
@pytest.mark.parametrize(
    ("dtype", "pad_value", "match"),
    [
        (torch.uint8, -1, r"pad_value=-1 is not representable in torch.uint8 \(integers in \[0, 255\]\)"),
        (torch.int64, 0.5, r"pad_value=0.5 is not representable in torch.int64"),
        (torch.bool, 2, r"pad_value=2 is not representable in torch.bool \(0 and 1"),
        (torch.float16, 1e5, r"pad_value=100000.0 overflows torch.float16 \(finite values in \[-65504.0, 65504.0\]"),
    ],
)  # fmt: skip
def test_bad_pad_value_one_message_on_both_paths(path, dtype, pad_value, match, monkeypatch):
    # the reference path runs the kernel's own check: the same words whatever the device
    if path == "reference":
        monkeypatch.setattr(pad_module, "has_kernel", lambda op, device_type: False)
        monkeypatch.setattr(pad_module, "warn_fallback", lambda *args: None)
    with pytest.raises(ValueError, match=match):
        torchfeed.pad(
            [torch.zeros(2, dtype=dtype), torch.zeros(1, dtype=dtype)], pad_value=pad_value
        )
    values, offsets = torch.zeros(3, dtype=dtype), torch.tensor([0, 2, 3])
    with pytest.raises(ValueError, match=match):
        torchfeed.pad_packed(values, offsets, pad_value=pad_value)


@pytest.mark.cuda
def test_mixed_devices():
    with pytest.raises(
        ValueError, match=r"sequences\[1\] is on cuda:0 but sequences\[0\] is on cpu"
    ):
        torchfeed.pad([torch.arange(3), torch.arange(3, device="cuda")])


def test_mixed_devices_reference_path(monkeypatch):
    # Without a GPU, the check is shown on the reference path with a meta tensor.
    monkeypatch.setattr(pad_module, "has_kernel", lambda op, device_type: False)
    monkeypatch.setattr(pad_module, "warn_fallback", lambda *args: None)
    with pytest.raises(ValueError, match=r"sequences\[1\] is on meta but sequences\[0\] is on cpu"):
        torchfeed.pad([torch.arange(3), torch.empty(3, dtype=torch.int64, device="meta")])


def test_packed_tensor_passed_as_list():
    with pytest.raises(TypeError, match="sequences must be a list of tensors"):
        torchfeed.pad(torch.arange(4))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(padding_side="middle"), ValueError, "padding_side must be 'right' or 'left'"),
        (dict(truncation_side="up"), ValueError, "truncation_side must be 'right' or 'left'"),
        (dict(pad_to_multiple_of=0), ValueError, "pad_to_multiple_of must be >= 1, got 0"),
        (dict(pad_to_multiple_of=-8), ValueError, "pad_to_multiple_of must be >= 1, got -8"),
        (dict(pad_to_multiple_of=2.0), TypeError, "pad_to_multiple_of must be an int"),
        (dict(max_length=0), ValueError, "max_length must be >= 1, got 0"),
        (dict(pad_value=1.5), ValueError, r"pad_value=1.5 is not representable in torch.int64"),
        (dict(pad_value=2**63), ValueError, r"not representable in torch.int64"),
        (dict(pad_value="0"), TypeError, "pad_value must be a Python number"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        torchfeed.pad([torch.arange(3)], **kwargs)


def test_pad_value_range_per_dtype():
    with pytest.raises(ValueError, match="not representable in torch.uint8"):
        torchfeed.pad([torch.arange(3, dtype=torch.uint8)], pad_value=-1)
    with pytest.raises(ValueError, match="not representable in torch.bool"):
        torchfeed.pad([torch.ones(3, dtype=torch.bool)], pad_value=2)
    out = torchfeed.pad(
        [torch.arange(3, dtype=torch.int16), torch.arange(1, dtype=torch.int16)], pad_value=2.0
    )
    assert out.padded[1].tolist() == [0, 2, 2]


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        ([1, 3, 5], r"offsets\[0\] must be 0, got 1"),
        ([0, 4, 2, 5], r"offsets must be non-decreasing, got offsets\[1\]=4 > offsets\[2\]=2"),
        ([0, 2, 4], r"offsets\[-1\] must equal values.shape\[0\]=5, got 4"),
    ],
)
def test_bad_offsets(offsets, match):
    with pytest.raises(ValueError, match=match):
        torchfeed.pad_packed(torch.arange(5), torch.tensor(offsets))


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        ([1, 3, 5], r"offsets\[0\] must be 0, got 1"),
        ([0, 4, 2, 5], r"offsets must be non-decreasing, got offsets\[1\]=4 > offsets\[2\]=2"),
        ([0, 2, 4], r"offsets\[-1\] must equal values.shape\[0\]=5, got 4"),
    ],
)
def test_bad_offsets_raw_op(offsets, match):
    with pytest.raises(ValueError, match=match):
        torch.ops.torchfeed.pad_packed(torch.arange(5), torch.tensor(offsets), 5)


def test_bad_offsets_type_and_shape():
    with pytest.raises(TypeError, match="offsets must be int64, got torch.int32"):
        torchfeed.pad_packed(torch.arange(5), torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"offsets must be 1-D with B\+1 >= 1 entries"):
        torchfeed.pad_packed(torch.arange(5), torch.tensor([[0, 5]]))
    with pytest.raises(ValueError, match="values must have at least one dimension"):
        torchfeed.pad_packed(torch.tensor(3), torch.tensor([0]))
    with pytest.raises(TypeError, match="pad_packed: offsets must be int64, got torch.int32"):
        torch.ops.torchfeed.pad_packed(torch.arange(5), torch.tensor([0, 5], dtype=torch.int32), 5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-2,), r"length must be >= 0 \(or -1: the longest kept length\), got -2"),
        ((3, 0, False, -1, False, 8), "multiple=8 applies to length=-1 only"),
        ((-1, 0, False, -1, False, 0), "multiple must be >= 1, got 0"),
        ((3, 0, False, 0), r"max_length must be >= 1 \(or -1 for no limit\), got 0"),
        (
            (3, 300),
            r"pad_list: pad_value=300 is not representable in torch.uint8 \(integers in \[0, 255\]\)",
        ),
    ],
)
def test_bad_raw_op_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        torch.ops.torchfeed.pad_list([torch.arange(3, dtype=torch.uint8)], *args)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_cuda_thread_body_matches_cpu_kernel(dtype):
    for _, seqs in sample_sequences("cpu", dtype):
        values = torch.cat(seqs)
        offsets = torch.tensor([0, *itertools.accumulate(s.shape[0] for s in seqs)])
        longest = max(s.shape[0] for s in seqs)
        for left, trunc, max_length, extra in itertools.product(
            (False, True), (False, True), (-1, 1, 3), (0, 2)
        ):
            args = (values, offsets, longest + extra, 1, left, max_length, trunc)
            want = torch.ops.torchfeed.pad_packed(*args)
            got = torch.ops.torchfeed_testing.emulate_cuda_pad_packed(*args)
            for a, b in zip(got, want, strict=True):
                assert_bits_equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_cuda_matches_cpu(dtype):
    for (_, cpu_seqs), (_, gpu_seqs) in zip(
        sample_sequences("cpu", dtype), sample_sequences("cuda", dtype), strict=True
    ):
        for options in OPTIONS:
            a = torchfeed.pad(cpu_seqs, pad_value=1, **options)
            b = torchfeed.pad(gpu_seqs, pad_value=1, **options)
            for x, y in zip(a, b, strict=True):
                assert_bits_equal(y, x)
            rb = torchfeed.RaggedBatch.from_sequences(gpu_seqs)
            c = rb.pad(pad_value=1, **options)
            for x, y in zip(a, c, strict=True):
                assert_bits_equal(y, x)


@pytest.mark.cuda
def test_cuda_uses_current_stream():
    seqs = [torch.arange(n, device="cuda") for n in (300, 5, 1000)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = torchfeed.pad(seqs, pad_value=-1)
    side.synchronize()
    check_against_reference(
        out,
        seqs,
        -1,
        padding_side="right",
        truncation_side="right",
        max_length=None,
        pad_to_multiple_of=None,
    )


def grad_inputs():
    g = torch.Generator().manual_seed(3)
    return [
        torch.randn(n, 2, dtype=torch.float64, generator=g, requires_grad=True) for n in (3, 0, 5)
    ]


# opcheck's test_aot_dispatch_dynamic reads .grad of a non-leaf with any op that has gradients
# (a one-line custom_op does it too): its warning, not ours.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("options", [(0.0, False, -1, False, 1), (1.5, True, 4, True, 4)])
def test_gradcheck_and_opcheck_with_gradients(options):
    seqs = grad_inputs()
    pad_value, left, max_length, trunc_left, multiple = options
    list_op = lambda *s: torch.ops.torchfeed.pad_list(list(s), -1, *options)[0]  # noqa: E731
    assert torch.autograd.gradcheck(list_op, tuple(seqs))
    torch.library.opcheck(torch.ops.torchfeed.pad_list.default, (seqs, -1, *options))
    values = torch.cat(seqs).detach().requires_grad_()
    offsets = torch.tensor([0, 3, 3, 8])
    length = 8 if multiple == 4 else 5
    packed_args = (offsets, length, pad_value, left, max_length, trunc_left)
    packed_op = lambda v: torch.ops.torchfeed.pad_packed(v, *packed_args)[0]  # noqa: E731
    assert torch.autograd.gradcheck(packed_op, (values,))
    torch.library.opcheck(torch.ops.torchfeed.pad_packed.default, (values, *packed_args))


def test_no_graph_is_recorded_without_gradients():
    seqs = [s.detach() for s in grad_inputs()]
    assert torchfeed.pad(seqs).padded.grad_fn is None
    with torch.no_grad():
        assert torchfeed.pad(grad_inputs()).padded.grad_fn is None
    out = torchfeed.pad(grad_inputs())
    assert out.padded.grad_fn is not None and out.mask.grad_fn is None


def test_torch_compile_backward_matches_eager():
    def loss(seqs):
        out = torchfeed.pad(seqs, pad_value=-1.0, padding_side="left", pad_to_multiple_of=4)
        return (out.padded * out.padded.new_tensor([1.0, -2.0])).sum()

    eager_inputs, compiled_inputs = grad_inputs(), grad_inputs()
    loss(eager_inputs).backward()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(compiled_inputs).backward()
    for a, b in zip(eager_inputs, compiled_inputs, strict=True):
        assert torch.equal(a.grad, b.grad)
