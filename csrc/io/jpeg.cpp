// Crop-window JPEG decoding with libjpeg-turbo: only the rows and columns of a window are
// inverse-transformed, upsampled and colour-converted; decoding stops after the window's last
// row. A progressive file, whose scans libjpeg all decodes before the first row comes out, is
// decoded from a copy whose frame header declares only the rows down to the window's (and a
// margin), and at 1/8 scale without the scans whose coefficients that scale never reads. The
// window's pixels are bit-identical to a full decode sliced afterwards (tests check this against
// Pillow's decoder): the decoder works on a margin of one iMCU around the window so that chroma
// upsampling at the window's edges sees the same neighbours as in a full decode.
//
// Compiled only when CMake finds libjpeg-turbo >= 1.5 (jpeg_crop_scanline); without it the
// Python side decodes the whole image with Pillow and slices.
#include "io/jpeg.h"

#include <ATen/ATen.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>
// (after jpeglib.h) the codes of the headers, only to compare with the library loaded at run time
#include <jerror.h>

#include "common/py_repr.h"

namespace torchfeed::io {
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  // Decoding a file whose frame header was cut short of its scans (drop_unread_scans' keep_rows,
  // from rows_for_window): every scan's data goes on past the rows the header declares, and
  // libjpeg skips the rest to the next marker, warning of "extraneous" bytes. Those bytes are
  // expected then, and not decoded.
  bool rows_cut = false;
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Corrupt data is an error, not a warning: libjpeg would go on and return an image with garbage
// in it (a bad Huffman code, a marker in the middle of the entropy-coded data, data running
// out); torchvision returns such images when the file's structure is otherwise intact, and
// rejects many others only when it reads on to the end of the file, which a window decode does
// not. Refusing every corrupt-data warning means a window is returned only when every row of it
// decoded cleanly. Other warnings (an unknown JFIF version, say) do not touch the pixels.
//
// Warnings are told apart by the text the library at run time formats, never by their codes:
// the libjpeg a process loads need not be the one whose jerror.h we compiled against (its
// codes shift between libjpeg-turbo's 6.2 and 8 APIs, and between versions), and a code read
// against the wrong table can let a corrupt-data warning go by, or refuse a harmless one. (On
// the 2026-12-04 H200 runs a truncated file's first warning, "Premature end of JPEG file",
// went by and the next one was reported; build_info()["jpeg_runtime"] says which libjpeg a
// process loaded.)
void on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  if (jpeg_warning_refused(text, reinterpret_cast<ErrorManager*>(cinfo->err)->rows_cut)) {
    on_error(cinfo);
  }
}

// One decompressor. Every libjpeg call runs inside one of the static functions below, which set
// the jump target first and hold only trivially destructible locals, so a longjmp out of libjpeg
// never skips a destructor.
struct Decoder {
  jpeg_decompress_struct cinfo{};
  ErrorManager err{};
  bool created = false;

  Decoder() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.output_message = [](j_common_ptr) {};
    err.pub.emit_message = on_message;
    err.message[0] = '\0';
  }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  ~Decoder() {
    if (created) {
      jpeg_destroy_decompress(&cinfo);
    }
  }
};

bool read_header(Decoder& d, const uint8_t* data, size_t size) {
  if (setjmp(d.err.jump)) {
    return false;
  }
  jpeg_create_decompress(&d.cinfo);
  d.created = true;
  jpeg_mem_src(&d.cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d.cinfo, TRUE);
  return true;
}

struct Window {
  int64_t top, left, height, width;
};

// The output of a decode at 1/scale_denom of the image's size (libjpeg's scaled IDCT: 1, 2, 4
// or 8); its dimensions are computed, nothing is decoded. The caller checks scale_denom.
bool scale_output(Decoder& d, int64_t scale_denom) {
  if (setjmp(d.err.jump)) {
    return false;
  }
  d.cinfo.out_color_space = JCS_RGB;
  d.cinfo.scale_num = 1;
  d.cinfo.scale_denom = static_cast<unsigned int>(scale_denom);
  jpeg_calc_output_dimensions(&d.cinfo);
  return true;
}

// Whether libjpeg smooths this decode's blocks: a progressive file whose scans stop short of
// some coefficient's last bit (coef_bits, known once jpeg_start_decompress has read every scan)
// with block smoothing on. The estimate reads neighbouring blocks (two each side in
// libjpeg-turbo 2.1), and a decode cropped with jpeg_crop_scanline takes the crop's edge for
// the image's (pixels at a window's left edge differed by 2 levels from the whole decode).
bool smooths(const jpeg_decompress_struct& c) {
  if (!c.progressive_mode || !c.do_block_smoothing || c.coef_bits == nullptr) return false;
  for (int ci = 0; ci < c.num_components; ++ci) {
    for (int k = 0; k < DCTSIZE2; ++k) {
      if (c.coef_bits[ci][k] != 0) return true;
    }
  }
  return false;
}

// Decodes rows [top, top + height) and columns [left, left + width) of the (scaled) output into
// `out` (HWC, RGB). `row` has room for `rows_at_once` full-width RGB rows.
bool read_window(Decoder& d, Window w, uint8_t* out, uint8_t* row, int rows_at_once) {
  if (setjmp(d.err.jump)) {
    return false;
  }
  jpeg_decompress_struct& c = d.cinfo;
  jpeg_start_decompress(&c);
  const int64_t image_w = c.output_width;
  // an iMCU in output pixels: the scaled IDCT makes a block min_DCT_scaled_size pixels wide
#if JPEG_LIB_VERSION >= 70
  const int64_t block_w = c.min_DCT_h_scaled_size, block_h = c.min_DCT_v_scaled_size;
#else
  const int64_t block_w = c.min_DCT_scaled_size, block_h = c.min_DCT_scaled_size;
#endif
  const int64_t imcu_w = int64_t{c.max_h_samp_factor} * block_w;
  const int64_t imcu_h = int64_t{c.max_v_samp_factor} * block_h;
  // A file libjpeg smooths is decoded from its first row at full width, as a whole decode is.
  const bool whole = smooths(c);
  // Columns: a margin of one iMCU each side; jpeg_crop_scanline widens to iMCU boundaries.
  const int64_t x0 = whole ? 0 : std::max<int64_t>(0, w.left - imcu_w);
  const int64_t x1 = whole ? image_w : std::min(image_w, w.left + w.width + imcu_w);
  JDIMENSION xoffset = static_cast<JDIMENSION>(x0);
  JDIMENSION xwidth = static_cast<JDIMENSION>(x1 - x0);
  if (xwidth < c.output_width) {
    jpeg_crop_scanline(&c, &xoffset, &xwidth);
  } else {
    xoffset = 0;
  }
  // Rows: skip whole iMCU rows up to one iMCU row above the window, decode (and drop) the
  // margin, then the window; nothing below it is decoded.
  const int64_t y0 = whole ? 0 : std::max<int64_t>(0, (w.top - imcu_h) / imcu_h * imcu_h);
  if (y0 > 0) {
    jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(y0));
  }
  const int64_t row_bytes = int64_t{xwidth} * 3;
  const int64_t skip_cols = (w.left - int64_t{xoffset}) * 3;
  const int64_t out_row_bytes = w.width * 3;
  // Rows of the window that are whole decoded rows (the window spans the decoded columns: a
  // whole image) are decoded in place; the others go through `row` and are copied out.
  const bool in_place = skip_cols == 0 && row_bytes == out_row_bytes;
  JSAMPROW rows[16];
  int64_t y = c.output_scanline;
  const int64_t end = w.top + w.height;
  while (y < end) {
    const int64_t want = std::min<int64_t>(rows_at_once, end - y);
    for (int64_t i = 0; i < want; ++i) {
      const int64_t r = y + i;
      rows[i] = in_place && r >= w.top ? out + (r - w.top) * out_row_bytes : row + i * row_bytes;
    }
    const int64_t got = jpeg_read_scanlines(&c, rows, static_cast<JDIMENSION>(want));
    for (int64_t i = 0; i < got; ++i) {
      const int64_t r = y + i;
      if (r >= w.top && !in_place) {
        std::copy_n(rows[i] + skip_cols, out_row_bytes, out + (r - w.top) * out_row_bytes);
      }
    }
    if (got == 0) {  // cannot happen with a memory source (it raises at the end of data)
      std::snprintf(d.err.message, sizeof(d.err.message), "no rows decoded at row %lld",
                    static_cast<long long>(y));
      jpeg_abort_decompress(&c);
      return false;
    }
    y += got;
  }
  jpeg_abort_decompress(&c);
  return true;
}

// The frame's components, by the id scans name them with: where each sits in the frame, and
// whether the scaled IDCT turns its blocks into single pixels (after scale_output), so that its
// inverse transform reads the DC coefficient alone and never uses its AC coefficients. At 1/8
// scale that is the luma of a 4:2:0 file and every component of a 4:4:4, 4:2:2 or grayscale one.
struct FrameComponents {
  std::array<int8_t, 256> slot;  // component id -> index in the frame, -1 for none
  std::array<bool, MAX_COMPONENTS> dc_only{};
  int count = 0;
};

FrameComponents frame_components(const jpeg_decompress_struct& c) {
  FrameComponents f;
  f.slot.fill(-1);
  f.count = std::min(c.num_components, MAX_COMPONENTS);
  for (int ci = 0; ci < f.count; ++ci) {
    const jpeg_component_info& comp = c.comp_info[ci];
#if JPEG_LIB_VERSION >= 70
    f.dc_only[ci] = comp.DCT_h_scaled_size == 1 && comp.DCT_v_scaled_size == 1;
#else
    f.dc_only[ci] = comp.DCT_scaled_size == 1;
#endif
    f.slot[comp.component_id & 0xFF] = static_cast<int8_t>(ci);
  }
  return f;
}

// The bytes of a progressive JPEG that the window decoder reads, with the same pixels in the rows
// it decodes:
// - without the scans that only carry AC coefficients of dc_only components (an AC scan holds
//   one component): their coefficients feed nothing, a 1 x 1 IDCT reads the DC term only;
// - with the frame header declaring only the first `keep_rows` rows (0 or the image's height:
//   all; a Huffman-coded file only). libjpeg decodes every scan of a progressive file before it
//   returns a row, and entropy decoding is most of its cost; a scan of a cut file stops at the
//   declared bottom, and libjpeg skips the rest of its data to the next marker (rows_cut). The
//   caller keeps an iMCU row below the window, so that chroma upsampling sees the same neighbours
//   as in the whole file.
// Every other marker segment and scan is copied as it is, so what remains is a valid progressive
// JPEG, decoded with block smoothing off. `f.dropped` counts the scans left out, `f.rows` is the
// height the copy declares.
//
// Only for a complete file: every coefficient of every component sent down to its last bit.
// libjpeg smooths the blocks of a file whose scans stop early (estimating the coefficients it
// was never sent from the blocks around, the kept components' too), and the copy is decoded with
// smoothing off, which would change those pixels; a complete file has nothing to smooth. Returns
// false (and the caller decodes the original) for an incomplete file, a frame that is not
// progressive, or at anything unexpected: the decoder then reports it.
bool drop_unread_scans(const uint8_t* p, size_t n, const FrameComponents& frame, int64_t keep_rows,
                       ScanFilter& f) {
  f.data.clear();
  f.scans = f.dropped = 0;
  f.rows = 0;
  if (n < 4 || p[0] != 0xFF || p[1] != 0xD8) return false;
  // the last successive-approximation bit each coefficient was sent to; 0xFF: never sent
  std::array<std::array<uint8_t, DCTSIZE2>, MAX_COMPONENTS> sent_to;
  for (auto& bits : sent_to) bits.fill(0xFF);
  f.data.reserve(n);
  f.data.insert(f.data.end(), p, p + 2);
  size_t i = 2;
  while (true) {
    if (i >= n || p[i] != 0xFF) return false;
    size_t m = i;
    while (m < n && p[m] == 0xFF) ++m;  // fill bytes before a marker
    if (m >= n) return false;
    const uint8_t code = p[m];
    if (code == 0xD9) {  // EOI
      for (int ci = 0; ci < frame.count; ++ci) {
        for (uint8_t bit : sent_to[ci]) {
          if (bit != 0) return false;  // a coefficient not sent in full: libjpeg smooths
        }
      }
      f.data.push_back(0xFF);
      f.data.push_back(0xD9);
      return true;
    }
    // SOI again, TEM, a restart or a stuffed zero have no business between segments
    if (code == 0x00 || code == 0x01 || code == 0xD8 || (code >= 0xD0 && code <= 0xD7)) {
      return false;
    }
    if (n - m < 3) return false;
    const size_t len = size_t{p[m + 1]} << 8 | p[m + 2];
    if (len < 2 || len > n - m - 1) return false;
    const size_t end = m + 1 + len;
    if (code != 0xDA) {  // any other segment (tables, frame header, APPn, ...) as it is
      f.data.push_back(0xFF);
      f.data.insert(f.data.end(), p + m, p + end);
      if (code == 0xC2 || code == 0xCA) {  // a progressive frame header: P, Y (rows), X, ...
        if (len < 8 || f.rows != 0) return false;
        f.rows = int64_t{p[m + 4]} << 8 | p[m + 5];
        if (f.rows == 0) return false;  // rows declared later (DNL): libjpeg refuses it
        // Rows are cut in Huffman-coded files only: how libjpeg's arithmetic decoder leaves a
        // scan it stops early is untested (no encoder at hand writes such files).
        if (code == 0xC2 && keep_rows > 0 && keep_rows < f.rows) {
          f.rows = keep_rows;
          uint8_t* y = f.data.data() + f.data.size() - (end - m) + 4;  // the copy's Y
          y[0] = static_cast<uint8_t>(keep_rows >> 8);
          y[1] = static_cast<uint8_t>(keep_rows & 0xFF);
        }
      } else if (code >= 0xC0 && code <= 0xCF && code != 0xC4 && code != 0xC8 && code != 0xCC) {
        return false;  // any other frame type: not for this filter
      }
      i = end;
      continue;
    }
    // SOS: Ns, Ns x (Cs, Td/Ta), Ss, Se, Ah/Al; then entropy-coded data up to the next marker
    // that is neither a stuffed zero nor a restart marker
    if (f.rows == 0) return false;  // a scan before the frame header
    const uint8_t* h = p + m + 3;
    const size_t ns = len > 2 ? h[0] : 0;
    if (ns < 1 || ns > 4 || len != 2 + 1 + 2 * ns + 3) return false;
    const uint8_t ss = h[1 + 2 * ns];
    const uint8_t se = h[2 + 2 * ns];
    const uint8_t al = h[3 + 2 * ns] & 0x0F;
    if (ss > se || se >= DCTSIZE2) return false;
    for (size_t k = 0; k < ns; ++k) {
      const int ci = frame.slot[h[1 + 2 * k]];
      if (ci < 0) return false;
      std::fill(sent_to[ci].begin() + ss, sent_to[ci].begin() + se + 1, al);
    }
    size_t j = end;
    while (true) {
      const void* ff = j < n ? std::memchr(p + j, 0xFF, n - j) : nullptr;
      if (ff == nullptr) return false;  // no marker after the data: the decoder will say so
      j = static_cast<size_t>(static_cast<const uint8_t*>(ff) - p);
      if (j + 1 >= n) return false;
      const uint8_t next = p[j + 1];
      if (next == 0x00 || (next >= 0xD0 && next <= 0xD7)) {
        j += 2;
        continue;
      }
      break;  // a marker (or fill bytes before one)
    }
    ++f.scans;
    if (ns == 1 && ss > 0 && frame.dc_only[frame.slot[h[1]]]) {
      ++f.dropped;
    } else {
      f.data.push_back(0xFF);
      f.data.insert(f.data.end(), p + m, p + j);
    }
    i = j;
  }
}

// The file a progressive JPEG is decoded from at d's scale when only its first `keep_rows` rows
// are needed (drop_unread_scans). False, with `f` empty, when nothing would change (a
// sequential file, a window that needs the last rows at a scale whose IDCT reads every AC term),
// when the file's scans stop before their last bits, or when the filter does not follow the
// file: the original is decoded then.
bool filter_scans(const Decoder& d, const uint8_t* p, size_t n, int64_t keep_rows, ScanFilter& f) {
  const FrameComponents frame = frame_components(d.cinfo);
  const bool any =
      std::find(frame.dc_only.begin(), frame.dc_only.end(), true) != frame.dc_only.end();
  const bool cut = keep_rows > 0 && keep_rows < int64_t{d.cinfo.image_height};
  if (d.cinfo.progressive_mode && (any || cut) && drop_unread_scans(p, n, frame, keep_rows, f) &&
      (f.dropped > 0 || f.rows < int64_t{d.cinfo.image_height})) {
    return true;
  }
  f = ScanFilter{};
  return false;
}

// The image rows (at full scale) a window's rows [0, bottom) of the decode at 1/scale_denom
// come from, and one iMCU row more: the neighbours chroma upsampling reads below the window's
// last row are then the whole file's (the last iMCU row of a cut file is upsampled against
// copies of its own last row, as an image's bottom is). At most the image's height (nothing cut).
// The callers check 0 <= bottom <= output_height (< 2^16), so no product overflows.
int64_t rows_for_window(const jpeg_decompress_struct& c, int64_t bottom, int64_t scale_denom) {
  const int64_t imcu = int64_t{c.max_v_samp_factor} * DCTSIZE;
  const int64_t rows = (bottom * scale_denom + imcu - 1) / imcu * imcu + imcu;
  return std::min<int64_t>(rows, c.image_height);
}

// A decoder of the filtered file at the original's scale, with block smoothing off:
// libjpeg-turbo smooths a progressive file's blocks whose coefficients are still unknown, the DC
// term too when every AC term of a component is missing (as in a file without its AC scans); a
// complete file has nothing to smooth, so this keeps its pixels.
bool open_filtered(Decoder& lean, const ScanFilter& f, const Decoder& original, int64_t scale_denom,
                   int64_t bottom) {
  if (!read_header(lean, f.data.data(), f.data.size())) return false;
  lean.cinfo.do_block_smoothing = FALSE;
  lean.err.rows_cut = f.rows < int64_t{original.cinfo.image_height};
  return scale_output(lean, scale_denom) && int64_t{lean.cinfo.image_height} == f.rows &&
         lean.cinfo.output_width == original.cinfo.output_width &&
         int64_t{lean.cinfo.output_height} >= bottom;
}

const uint8_t* checked_data(const at::Tensor& data, const char* fn) {
  TORCH_CHECK_VALUE(data.device().is_cpu(), fn, ": data must be a CPU tensor, got ", data.device());
  TORCH_CHECK_TYPE(data.scalar_type() == at::kByte, fn,
                   ": data must be uint8 (the encoded file's bytes), got ",
                   py_dtype(data.scalar_type()));
  TORCH_CHECK_VALUE(data.dim() == 1 && data.is_contiguous(), fn,
                    ": data must be a contiguous 1-D tensor of bytes, got shape ", data.sizes());
  TORCH_CHECK_VALUE(data.numel() > 0, fn, ": data is empty (0 bytes)");
  return data.data_ptr<uint8_t>();
}

bool supported(J_COLOR_SPACE space) {
  return space == JCS_GRAYSCALE || space == JCS_YCbCr || space == JCS_RGB;
}

}  // namespace

JpegInfo jpeg_info(const at::Tensor& data) {
  const uint8_t* bytes = checked_data(data, "jpeg_info");
  Decoder d;
  TORCH_CHECK(read_header(d, bytes, data.numel()),
              "jpeg_info: not a readable JPEG: ", d.err.message);
  return {d.cinfo.image_height, d.cinfo.image_width, d.cinfo.num_components,
          supported(d.cinfo.jpeg_color_space)};
}

at::Tensor decode_jpeg_window_cpu(const at::Tensor& data, int64_t top, int64_t left, int64_t height,
                                  int64_t width, int64_t max_pixels, int64_t scale_denom) {
  const uint8_t* bytes = checked_data(data, "decode_jpeg_window");
  Decoder d;
  TORCH_CHECK(read_header(d, bytes, data.numel()),
              "decode_jpeg_window: not a readable JPEG: ", d.err.message);
  const int64_t image_h = d.cinfo.image_height;
  const int64_t image_w = d.cinfo.image_width;
  TORCH_CHECK_VALUE(supported(d.cinfo.jpeg_color_space), "decode_jpeg_window: colour space ",
                    static_cast<int>(d.cinfo.jpeg_color_space),
                    " (CMYK/YCCK) cannot be decoded to RGB here; decode the whole image instead");
  // A decoder allocates for the whole image (a progressive one buffers all its coefficients), so
  // the bound is on the size the header declares, checked before anything is allocated.
  TORCH_CHECK_VALUE(max_pixels <= 0 || image_h * image_w <= max_pixels,
                    "decode_jpeg_window: the JPEG declares ", image_h, " x ", image_w, " = ",
                    image_h * image_w, " pixels, more than the limit of ", max_pixels,
                    " (torchfeed.limits.set_max_image_pixels(), or the environment variable "
                    "TORCHFEED_MAX_IMAGE_PIXELS, changes it)");
  TORCH_CHECK_VALUE(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
                    "decode_jpeg_window: scale_denom must be 1, 2, 4 or 8 (libjpeg-turbo's "
                    "SIMD-accelerated scales), got ",
                    scale_denom);
  TORCH_CHECK(scale_output(d, scale_denom), "decode_jpeg_window: corrupt JPEG: ", d.err.message);
  const int64_t scaled_h = d.cinfo.output_height;
  const int64_t scaled_w = d.cinfo.output_width;
  TORCH_CHECK_VALUE(height >= 1 && width >= 1,
                    "decode_jpeg_window: the window's height and width must be >= 1, got ", height,
                    " x ", width);
  // Image sides are < 2^16: compared without adding to top/left, no sum can overflow.
  TORCH_CHECK_VALUE(top >= 0 && left >= 0 && height <= scaled_h && width <= scaled_w &&
                        top <= scaled_h - height && left <= scaled_w - width,
                    "decode_jpeg_window: window (top ", top, ", left ", left, ", height ", height,
                    ", width ", width, ") must lie inside the ", scaled_h, " x ", scaled_w,
                    " image", scale_denom > 1 ? " (the JPEG at 1/" : "",
                    scale_denom > 1 ? std::to_string(scale_denom) + " of its size)" : "");
  // A progressive file: decode only its rows down to the window's (and a margin), and without
  // the scans that carry only AC coefficients its scaled IDCT never reads. The same pixels, a
  // fraction of the entropy decoding.
  ScanFilter filtered;
  Decoder lean;
  Decoder* use = &d;
  const int64_t keep_rows = rows_for_window(d.cinfo, top + height, scale_denom);
  if (filter_scans(d, bytes, data.numel(), keep_rows, filtered) &&
      open_filtered(lean, filtered, d, scale_denom, top + height)) {
    use = &lean;
  }
  // HWC memory, returned as a CHW view: the order torchvision's decoder returns.
  at::Tensor out = at::empty({height, width, 3}, data.options());
  const int rows_at_once = std::clamp(d.cinfo.max_v_samp_factor * DCTSIZE, 1, 16);
  // jpeg_crop_scanline never widens past the (scaled) image
  std::vector<uint8_t> row(static_cast<size_t>(scaled_w) * 3 * rows_at_once);
  bool ok = read_window(*use, {top, left, height, width}, out.data_ptr<uint8_t>(), row.data(),
                        rows_at_once);
  if (!ok && use == &lean) {  // whatever the filtered file's decoder disliked: the original's say
    use = &d;
    ok = read_window(d, {top, left, height, width}, out.data_ptr<uint8_t>(), row.data(),
                     rows_at_once);
  }
  TORCH_CHECK(ok, "decode_jpeg_window: corrupt JPEG: ", use->err.message);
  return out.permute({2, 0, 1});
}

ScanFilter jpeg_scans_filtered(const at::Tensor& data, int64_t scale_denom, int64_t bottom) {
  const uint8_t* bytes = checked_data(data, "jpeg_scans_filtered");
  Decoder d;
  TORCH_CHECK(read_header(d, bytes, data.numel()),
              "jpeg_scans_filtered: not a readable JPEG: ", d.err.message);
  TORCH_CHECK_VALUE(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
                    "jpeg_scans_filtered: scale_denom must be 1, 2, 4 or 8, got ", scale_denom);
  TORCH_CHECK(scale_output(d, scale_denom), "jpeg_scans_filtered: corrupt JPEG: ", d.err.message);
  TORCH_CHECK_VALUE(bottom >= 0 && bottom <= int64_t{d.cinfo.output_height},
                    "jpeg_scans_filtered: bottom must be 0 (the last row) or a row count up to the "
                    "scaled image's height ",
                    d.cinfo.output_height, ", got ", bottom);
  ScanFilter f;
  const int64_t keep_rows = bottom > 0 ? rows_for_window(d.cinfo, bottom, scale_denom) : 0;
  filter_scans(d, bytes, data.numel(), keep_rows, f);
  return f;
}

bool jpeg_warning_refused(const char* text, bool rows_cut) {
  if (rows_cut && std::strstr(text, "extraneous bytes before marker") != nullptr) return false;
  return std::strncmp(text, "Corrupt JPEG data", 17) == 0 ||  // every corrupt-data warning
         std::strncmp(text, "Premature end of JPEG file", 26) == 0 ||
         std::strncmp(text, "Inconsistent progression sequence", 33) == 0;
}

std::string jpeg_library_version() {
#ifdef LIBJPEG_TURBO_VERSION
#define TORCHFEED_STR2(x) #x
#define TORCHFEED_STR(x) TORCHFEED_STR2(x)
  return "libjpeg-turbo " TORCHFEED_STR(LIBJPEG_TURBO_VERSION);
#else
  return "libjpeg " + std::to_string(JPEG_LIB_VERSION);
#endif
}

std::string jpeg_runtime_library() {
  // The library this process resolved libjpeg's functions to, and whether its message table is
  // the one of the headers we compiled against (a process can load another libjpeg first).
  Dl_info where{};
  std::string path =
      dladdr(reinterpret_cast<void*>(&jpeg_std_error), &where) != 0 && where.dli_fname != nullptr
          ? where.dli_fname
          : "unknown";
  jpeg_error_mgr err{};
  jpeg_std_error(&err);
  const bool same =
      err.last_jpeg_message == static_cast<int>(JMSG_LASTMSGCODE) - 1 &&
      err.jpeg_message_table != nullptr &&
      std::strcmp(err.jpeg_message_table[JWRN_JPEG_EOF], "Premature end of JPEG file") == 0;
  return path + (same ? " (its message codes match the headers)"
                      : " (its message codes differ from the headers': " +
                            std::to_string(err.last_jpeg_message + 1) + " messages against " +
                            std::to_string(static_cast<int>(JMSG_LASTMSGCODE)) + ")");
}

}  // namespace torchfeed::io

TORCH_LIBRARY_IMPL(torchfeed, CPU, m) {
  m.impl("decode_jpeg_window", &torchfeed::io::decode_jpeg_window_cpu);
}
