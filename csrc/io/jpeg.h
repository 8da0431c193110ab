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

// The progressive JPEG decode_jpeg_window decodes from at 1/scale_denom when a window's last row
// is `bottom` - 1 in that decode (0: the last row of the image): without the AC scans of the
// components whose IDCT reads only the DC coefficient, and with its frame header declaring only
// the rows the window needs (and a margin). `scans` counts the file's scans, `dropped` those left
// out, `rows` is the height the filtered file declares. Empty (0 scans) when nothing changes: a
// sequential file, a window down to the last rows at a scale whose IDCT reads every AC term, or a
// file the filter does not follow. Exposed for tests.
struct ScanFilter {
  std::vector<uint8_t> data;
  int scans = 0;
  int dropped = 0;
  int64_t rows = 0;
};
ScanFilter jpeg_scans_filtered(const at::Tensor& data, int64_t scale_denom, int64_t bottom);

// Whether a libjpeg warning, as the loaded library formats it, refuses the decode: every
// corrupt-data warning (a window is returned only when every row of it decoded cleanly), except
// the extraneous bytes of a frame header cut short of its scans (rows_cut).
bool jpeg_warning_refused(const char* text, bool rows_cut);

std::string jpeg_library_version();
// The shared library libjpeg's functions resolved to in this process, and whether its message
// codes are the compiled headers' (build_info()["jpeg_runtime"]).
std::string jpeg_runtime_library();

}  // namespace torchfeed::io
