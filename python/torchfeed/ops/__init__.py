"""The Python faces of torchfeed's ops, one module per op as in ``csrc/ops``:

- :mod:`torchfeed.ops.pad`: ``torch.ops.torchfeed.pad_list`` / ``pad_packed``;
- :mod:`torchfeed.ops.crop_flip_normalize`: ``crop_flip_normalize_out`` / ``..._list_out``;
- :mod:`torchfeed.ops.decode_jpeg_window`: ``decode_jpeg_window`` (with libjpeg-turbo).

Each holds the typed wrapper, its options value, the fake kernel (``torch.compile`` traces the
ops without a graph break) and the fallback for devices without a compiled kernel
(:mod:`torchfeed.ops._dispatch` has the table and the policy). Features (collates, transforms,
rings, loaders) import these; these import no feature.
"""

# The op modules only: a function re-exported here under its module's name (pad, ...) would
# shadow the module (``import torchfeed.ops.pad`` would give the function). The functions are
# exported at the top level (torchfeed.pad, ...).
from torchfeed.ops import crop_flip_normalize, decode_jpeg_window, pad

__all__ = ["crop_flip_normalize", "decode_jpeg_window", "pad"]
