// Crop-window JPEG decoding (io/jpeg.cpp), built when libjpeg-turbo is found.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

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

// A progressive JPEG without the AC scans of the components whose IDCT at 1/scale_denom reads
// only the DC coefficient (what decode_jpeg_window decodes from); `scans` counts the file's
// scans, `dropped` those left out. Empty (0 scans) when nothing is dropped: a sequential file, a
// scale whose IDCT reads every AC term, or a file the filter does not follow. Exposed for tests.
struct ScanFilter {
  std::vector<uint8_t> data;
  int scans = 0;
  int dropped = 0;
};
ScanFilter jpeg_unread_scans_dropped(const at::Tensor& data, int64_t scale_denom);

std::string jpeg_library_version();

}  // namespace torchfeed::io
