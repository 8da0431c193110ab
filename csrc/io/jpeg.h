// Crop-window JPEG decoding (io/jpeg.cpp), built when libjpeg-turbo is found.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace torchfeed::io {

struct JpegInfo {
  int64_t height;
  int64_t width;
  int64_t components;
  bool rgb_decodable;  // grayscale, YCbCr or RGB (not CMYK/YCCK)
};

// Reads the header only. Raises if `data` is not a readable JPEG.
JpegInfo jpeg_info(const at::Tensor& data);

// The RGB pixels of rows [top, top + height) and columns [left, left + width) of the JPEG decoded
// at 1/scale_denom of its size (1, 2, 4 or 8): uint8 [3, height, width] in HWC memory order.
// Refuses an image whose header declares more than max_pixels pixels (<= 0: no bound), and
// corrupt data anywhere in the rows it decodes.
at::Tensor decode_jpeg_window_cpu(const at::Tensor& data, int64_t top, int64_t left, int64_t height,
                                  int64_t width, int64_t max_pixels, int64_t scale_denom);

std::string jpeg_library_version();

}  // namespace torchfeed::io
