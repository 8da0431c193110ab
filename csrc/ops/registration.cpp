// Every schema of the torchfeed namespace, in one place. Each backend file ends with its own
// TORCH_LIBRARY_IMPL; the fake (meta) kernels live beside the Python wrappers.
#include <torch/library.h>

TORCH_LIBRARY(torchfeed, m) {
  // Ragged rows -> padded [B, length, *feat], mask [B, length] (from the lengths, never from the
  // values), kept lengths [B]. `length` is computed by the caller on the host, where the lengths
  // are known, so the output shape never depends on device data.
  m.def(
      "pad_packed(Tensor values, Tensor offsets, SymInt length, Scalar pad_value=0, "
      "bool left_pad=False, int max_length=-1, bool truncate_left=False) "
      "-> (Tensor padded, Tensor mask, Tensor lengths)");
  m.def(
      "pad_list(Tensor[] sequences, SymInt length, Scalar pad_value=0, bool left_pad=False, "
      "int max_length=-1, bool truncate_left=False) "
      "-> (Tensor padded, Tensor mask, Tensor lengths)");
}
