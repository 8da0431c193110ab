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

  // uint8 images -> per-image crop, resize (nearest / bilinear, antialias or not), horizontal
  // flip, scale to [0, 1] and normalize, written once into `out` [B, C, H_out, W_out] (float32,
  // float16 or bfloat16; NCHW or channels_last). `grid` [B, 10] float64 holds each image's
  // sampling geometry (ops/crop_flip_normalize.h: AxisGeom for y, then x).
  m.def(
      "crop_flip_normalize_out(Tensor images, Tensor grid, Tensor flips, int interpolation, "
      "bool antialias, float[] mean, float[] std, Tensor(a!) out) -> ()");
  m.def(
      "crop_flip_normalize_list_out(Tensor[] images, Tensor grid, Tensor flips, "
      "int interpolation, bool antialias, float[] mean, float[] std, Tensor(a!) out) -> ()");

#ifdef TORCHFEED_WITH_JPEG
  // Encoded JPEG bytes (uint8 [N]) -> the RGB pixels of one window, uint8 [3, height, width] in
  // HWC memory order (as torchvision's decode_jpeg returns); decodes only what the window needs
  // (io/jpeg.cpp). Built only with libjpeg-turbo.
  m.def("decode_jpeg_window(Tensor data, int top, int left, int height, int width) -> Tensor");
#endif
}
