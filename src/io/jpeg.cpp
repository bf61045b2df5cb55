#include "io/jpeg.h"

#include <csetjmp>
#include <cstdlib>
#include <cstdio>  // jpeglib.h uses FILE without including it
#include <vector>

#include <jerror.h>
#include <jpeglib.h>

#include "core/error.h"

namespace sd::io {

namespace {

// One decompression of a JPEG held in memory. libjpeg reports an error by calling error_exit, which must not return:
// it longjmps back into the member function that called libjpeg, which returns false. Those functions keep no object
// with a destructor in their frame, so the jump skips no cleanup.
class JpegReader {
 public:
  explicit JpegReader(std::string_view bytes) : bytes_(bytes) {
    info_.err = jpeg_std_error(&errors_);
    errors_.error_exit = &JpegReader::on_error;
    errors_.emit_message = &JpegReader::on_message;
    progress_.progress_monitor = &JpegReader::on_progress;
    info_.client_data = this;
  }
  ~JpegReader() { jpeg_destroy_decompress(&info_); }  // safe at any stage: it frees what was allocated
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;

  // Reads the headers up to the first scan.
  bool read_header() {
    if (setjmp(jump_)) return false;
    jpeg_create_decompress(&info_);  // zeroes every field but err and client_data
    info_.progress = &progress_;
    jpeg_mem_src(&info_, reinterpret_cast<const unsigned char*>(bytes_.data()), bytes_.size());
    jpeg_read_header(&info_, TRUE);
    return !truncated_;
  }
  int width() const { return static_cast<int>(info_.image_width); }
  int height() const { return static_cast<int>(info_.image_height); }

  // Decodes into `rgb` (width × height × 3 bytes) after read_header.
  bool read_rgb(uint8_t* rgb) {
    const bool cmyk = info_.jpeg_color_space == JCS_CMYK || info_.jpeg_color_space == JCS_YCCK;
    if (cmyk) cmyk_row_.resize(static_cast<size_t>(width()) * 4);
    if (setjmp(jump_)) return false;
    info_.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(&info_);
    while (info_.output_scanline < info_.output_height) {
      uint8_t* out = rgb + static_cast<size_t>(info_.output_scanline) * width() * 3;
      JSAMPROW row = cmyk ? cmyk_row_.data() : out;
      jpeg_read_scanlines(&info_, &row, 1);
      if (cmyk) cmyk_to_rgb(cmyk_row_.data(), out, width());
    }
    jpeg_finish_decompress(&info_);
    return !truncated_;
  }

  // libjpeg's message for the error (or the truncation) that made a call return false.
  const char* message() const { return message_; }

 private:
  static JpegReader& self(j_common_ptr info) { return *static_cast<JpegReader*>(info->client_data); }

  // Data ending early is the cause of whatever error follows it, so its message is kept.
  [[noreturn]] static void on_error(j_common_ptr info) {
    if (!self(info).truncated_) info->err->format_message(info, self(info).message_);
    std::longjmp(self(info).jump_, 1);
  }

  // libjpeg warns and goes on, filling gray, where data ends early; PIL refuses such a file, and so does sdtrain.
  // Its other warnings (extraneous bytes before a marker, ...) PIL ignores, and so does sdtrain.
  static void on_message(j_common_ptr info, int level) {
    if (level >= 0 || info->err->msg_code != JWRN_JPEG_EOF) return;
    self(info).truncated_ = true;
    info->err->format_message(info, self(info).message_);
  }

  // A progressive JPEG may hold any number of scans, each a pass over the whole image, so a few KB could keep a loader
  // thread busy for hours. libjpeg-turbo's TurboJPEG API stops at 500 (encoders write about 10), and so does sdtrain.
  static constexpr int kMaxScans = 500;
  static void on_progress(j_common_ptr info) {
    const int scans = reinterpret_cast<j_decompress_ptr>(info)->input_scan_number;
    if (scans <= kMaxScans) return;
    std::snprintf(self(info).message_, JMSG_LENGTH_MAX, "more than %d progressive scans", kMaxScans);
    std::longjmp(self(info).jump_, 1);
  }

  // Pillow's conversion: the samples are stored inverted (Adobe's convention, which Pillow assumes for every CMYK
  // JPEG), then R = (255 - K) - C·(255 - K)/255 with Pillow's rounded division by 255, and the same for G and B.
  static void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int width) {
    for (int x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
      const int keep = cmyk[3];  // 255 - K, K being the inverted sample
      for (int c = 0; c < 3; ++c) {
        const int product = (255 - cmyk[c]) * keep + 128;
        rgb[c] = static_cast<uint8_t>(keep - (((product >> 8) + product) >> 8));
      }
    }
  }

  std::string_view bytes_;
  jpeg_decompress_struct info_{};
  jpeg_error_mgr errors_{};
  jpeg_progress_mgr progress_{};
  std::jmp_buf jump_{};
  char message_[JMSG_LENGTH_MAX] = "";
  bool truncated_ = false;
  std::vector<uint8_t> cmyk_row_;
};

// One compression into memory; errors longjmp back as JpegReader's do (libjpeg's are only allocation failures here).
class JpegWriter {
 public:
  JpegWriter() {
    info_.err = jpeg_std_error(&errors_);
    errors_.error_exit = &JpegWriter::on_error;
    info_.client_data = this;
  }
  ~JpegWriter() {
    jpeg_destroy_compress(&info_);
    std::free(buffer_);  // jpeg_mem_dest's buffer is the caller's to free
  }
  JpegWriter(const JpegWriter&) = delete;
  JpegWriter& operator=(const JpegWriter&) = delete;

  bool write(const RgbImage& image, int quality) {
    if (setjmp(jump_)) return false;
    jpeg_create_compress(&info_);
    jpeg_mem_dest(&info_, &buffer_, &size_);
    info_.image_width = static_cast<JDIMENSION>(image.width);
    info_.image_height = static_cast<JDIMENSION>(image.height);
    info_.input_components = 3;
    info_.in_color_space = JCS_RGB;
    jpeg_set_defaults(&info_);
    jpeg_set_quality(&info_, quality, TRUE);
    jpeg_start_compress(&info_, TRUE);
    while (info_.next_scanline < info_.image_height) {
      auto* row = const_cast<JSAMPLE*>(image.row(static_cast<int>(info_.next_scanline)));
      jpeg_write_scanlines(&info_, &row, 1);
    }
    jpeg_finish_compress(&info_);
    return true;
  }
  std::string bytes() const { return {reinterpret_cast<const char*>(buffer_), size_}; }

 private:
  static void on_error(j_common_ptr info) { std::longjmp(static_cast<JpegWriter*>(info->client_data)->jump_, 1); }

  jpeg_compress_struct info_{};
  jpeg_error_mgr errors_{};
  std::jmp_buf jump_{};
  unsigned char* buffer_ = nullptr;
  unsigned long size_ = 0;  // NOLINT(google-runtime-int): jpeg_mem_dest's type
};

}  // namespace

std::optional<std::pair<int, int>> jpeg_size(std::string_view head) {
  JpegReader reader(head);
  if (!reader.read_header() || reader.width() <= 0 || reader.height() <= 0) return std::nullopt;
  return std::make_pair(reader.width(), reader.height());
}

RgbImage decode_jpeg(std::string_view bytes, const std::string& name) {
  JpegReader reader(bytes);
  SD_CHECK(reader.read_header(), "{}: cannot decode image (corrupt JPEG data: {})", name, reader.message());
  check_image_pixels(reader.width(), reader.height(), name);
  RgbImage image{reader.width(), reader.height(),
                 std::vector<uint8_t>(static_cast<size_t>(reader.width()) * reader.height() * 3)};
  SD_CHECK(reader.read_rgb(image.pixels.data()), "{}: cannot decode image (corrupt JPEG data: {})", name,
           reader.message());
  return image;
}

std::string encode_jpeg(const RgbImage& image, int quality) {
  JpegWriter writer;
  SD_CHECK(writer.write(image, quality), "cannot encode a {}x{} image as JPEG", image.width, image.height);
  return writer.bytes();
}

}  // namespace sd::io
