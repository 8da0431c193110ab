// Every schema of the torchfeed namespace, in one place. Each backend file ends with its own
// TORCH_LIBRARY_IMPL; the fake (meta) kernels live beside the Python wrappers.
#include <torch/library.h>

TORCH_LIBRARY(torchfeed, m) {
  // Ragged rows -> padded [B, length, *feat], mask [B, length] (from the lengths, never from the
  // values), kept lengths [B]. `length` is computed by the caller on the host, where the lengths
  // are known, so the output shape never depends on device data. pad_list also takes
  // length=-1: the longest kept length (after max_length) rounded up to `multiple`, computed from
  // the sequences' shapes (on the host too).
  m.def(
      "pad_packed(Tensor values, Tensor offsets, SymInt length, Scalar pad_value=0, "
      "bool left_pad=False, int max_length=-1, bool truncate_left=False) "
      "-> (Tensor padded, Tensor mask, Tensor lengths)");
  m.def(
      "pad_list(Tensor[] sequences, SymInt length, Scalar pad_value=0, bool left_pad=False, "
      "int max_length=-1, bool truncate_left=False, int multiple=1) "
      "-> (Tensor padded, Tensor mask, Tensor lengths)");

  // uint8 images -> per-image crop, resize (nearest / bilinear, antialias or not), horizontal
  // flip, scale to [0, 1] and normalize, written once into `out` [B, C, H_out, W_out] (float32,
  // float16 or bfloat16; NCHW or channels_last). `grid` [B, 10] float64 holds each image's
  // sampling geometry (ops/crop_flip_normalize.h: AxisGeom for y, then x) and `flips` [B] bool
  // its flip; both always live on the host (checked there, sent with the launch). Images: a
  // dense batch [B, C, H, W], a list of [C, H_i, W_i] (or [H_i, W_i, C]: images_hwc), or one
  // packed buffer with `shapes` [B, 4] int64 on the host: (offset, C, H, W) per image.
  m.def(
      "crop_flip_normalize_out(Tensor images, Tensor grid, Tensor flips, int interpolation, "
      "bool antialias, float[] mean, float[] std, Tensor(a!) out) -> ()");
  m.def(
      "crop_flip_normalize_list_out(Tensor[] images, Tensor grid, Tensor flips, "
      "int interpolation, bool antialias, float[] mean, float[] std, Tensor(a!) out, "
      "bool images_hwc=False) -> ()");
  m.def(
      "crop_flip_normalize_packed_out(Tensor data, Tensor shapes, Tensor grid, Tensor flips, "
      "int interpolation, bool antialias, float[] mean, float[] std, Tensor(a!) out, "
      "bool images_hwc=False) -> ()");

  // The host-side planning of that op (ops/crop_flip_normalize_geometry.cpp), one call per
  // batch. (H, W) of each image, [B, 2] int64 on the host, after the kernels' per-image checks:
  m.def("image_sizes(Tensor[] images, bool images_hwc=False) -> Tensor");
  // The grid of crop-then-resize (RandomResizedCrop): boxes [B, 4] (top, left, height, width),
  // each inside its image (sizes [B, 2] int64):
  m.def("resized_crop_grid(Tensor sizes, Tensor boxes, int out_h, int out_w) -> Tensor");
  // The grid of resize-then-center-crop (torchvision's Resize + CenterCrop; resize_w = -1:
  // resize_h sets the shorter side):
  m.def(
      "resize_center_crop_grid(Tensor sizes, int resize_h, int resize_w, int crop_h, "
      "int crop_w) -> Tensor");
  // RandomResizedCrop's boxes, drawn per image from `generator`: one draw of [B, 22] uniforms
  // (int64 [B, 4]), or given as `uniforms` (float64 [B, 22]):
  m.def(
      "sample_resized_crop(Tensor sizes, float scale_lo, float scale_hi, float ratio_lo, "
      "float ratio_hi, Generator? generator=None, Tensor? uniforms=None) -> Tensor");
  // The same boxes and a horizontal flip per image with probability p_flip (bool [B]), from one
  // draw of [B, 23] uniforms (or `uniforms`): torchvision's RandomResizedCrop then
  // RandomHorizontalFlip. (One op and one draw: a compiled graph cannot reorder them.)
  m.def(
      "sample_crops_and_flips(Tensor sizes, float scale_lo, float scale_hi, float ratio_lo, "
      "float ratio_hi, float p_flip, Generator? generator=None, Tensor? uniforms=None) -> "
      "(Tensor boxes, Tensor flips)");
  // Uniforms [N, count] float64, row j from a generator of its own seeded from (base, keys[j],
  // stream): per-sample draws, whatever batch a sample is in (keys: int64 [N]).
  m.def("sample_uniforms(Tensor keys, int base, int stream, int count) -> Tensor");

#ifdef TORCHFEED_WITH_JPEG
  // Encoded JPEG bytes (uint8 [N]) -> the RGB pixels of one window, uint8 [3, height, width] in
  // HWC memory order (as torchvision's decode_jpeg returns); decodes only what the window needs
  // (io/jpeg.cpp). Built only with libjpeg-turbo.
  // `max_pixels` bounds the image the header declares (height * width; <= 0: no bound), checked
  // before anything is allocated. `scale_denom` (1, 2, 4 or 8) decodes the JPEG at that fraction
  // of its size (libjpeg-turbo's scaled IDCT): the window is then in the scaled image.
  m.def(
      "decode_jpeg_window(Tensor data, int top, int left, int height, int width, "
      "int max_pixels=89478485, int scale_denom=1) -> Tensor");
#endif
}
