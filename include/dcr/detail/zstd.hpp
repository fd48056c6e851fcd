// dcr/detail/zstd.hpp: RAII wrappers over zstd's compression and decompression contexts
// (implementation only).
//
// A context is expensive to create (tens to hundreds of KiB of tables), so the codec keeps one per
// encoder or decoder and reuses it for every stream. Frames are standard zstd frames that record
// their content size and carry no zstd checksum (the payload has its own), so the `zstd` CLI and
// plain ZSTD_decompress read them. The decompressor accepts exactly one such frame of an exactly
// known size: anything else is corrupt_payload, found before any output buffer is sized.
#pragma once

#include <zstd.h>
#include <zstd_errors.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "dcr/detail/varint.hpp"
#include "dcr/error.hpp"

namespace dcr::detail {

/// Most bytes one byte of a zstd frame can decode to: an RLE block is 4 bytes (3-byte header plus
/// the byte) and expands to at most 128 KiB; every other block expands less. A frame claiming a
/// larger content size is hostile, so it is refused before the output is allocated.
inline constexpr std::uint64_t zstd_max_expansion = 32768;

/// ZSTD_compressBound, or overflow when `n` bytes are beyond what zstd compresses in one call.
[[nodiscard]] inline std::size_t zstd_compress_bound(std::size_t n) {
  const std::size_t bound = ZSTD_compressBound(n);
  DCR_EXPECTS(!ZSTD_isError(bound) && bound != 0, errc::overflow,
              "zstd: " + std::to_string(n) + " bytes exceed zstd's input limit");
  return bound;
}

/// Room for one frame of `n` bytes compressed with `breaks` forced block starts: the zstd bound
/// plus a block header (3 bytes) and an empty last block for each extra block.
[[nodiscard]] inline std::size_t zstd_sections_bound(std::size_t n, std::size_t breaks) {
  return zstd_compress_bound(n) + 6 * (breaks + 1);
}

/// Owns a ZSTD_CCtx set to one compression level; movable, not copyable. Not thread-safe: one
/// per thread.
class zstd_compressor {
 public:
  /// A context at `level` (ZSTD_minCLevel()..ZSTD_maxCLevel(); 1 is the codec's default) with
  /// a match-finder hash table of 2^hash_log entries (0: the level's own; else within zstd's
  /// ZSTD_c_hashLog bounds). invalid_argument for values outside zstd's ranges.
  explicit zstd_compressor(int level = 1, int hash_log = 0) : ctx_(ZSTD_createCCtx()) {
    if (ctx_ == nullptr) throw std::bad_alloc();
    // Content size in the frame header lets the receiver check sizes before decompressing; the
    // payload's own XXH3 covers integrity, so zstd's 4-byte checksum would be redundant.
    check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_contentSizeFlag, 1));
    check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_checksumFlag, 0));
    set_level(level);
    if (hash_log != 0) {
      const ZSTD_bounds b = ZSTD_cParam_getBounds(ZSTD_c_hashLog);
      DCR_EXPECTS(!ZSTD_isError(b.error) && hash_log >= b.lowerBound && hash_log <= b.upperBound,
                  errc::invalid_argument,
                  "zstd: hash log " + std::to_string(hash_log) + " outside [" +
                      std::to_string(b.lowerBound) + ", " + std::to_string(b.upperBound) + "]");
      check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_hashLog, hash_log));
    }
  }

  /// Sets the level for later frames; invalid_argument outside zstd's range.
  void set_level(int level) {
    DCR_EXPECTS(level >= ZSTD_minCLevel() && level <= ZSTD_maxCLevel(), errc::invalid_argument,
                "zstd: compression level " + std::to_string(level) + " outside [" +
                    std::to_string(ZSTD_minCLevel()) + ", " + std::to_string(ZSTD_maxCLevel()) +
                    "]");
    check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_compressionLevel, level));
    level_ = level;
  }
  [[nodiscard]] int level() const noexcept { return level_; }

  /// Compresses `src` into one frame at the start of `dst` and returns its size. `dst` must hold
  /// zstd_compress_bound(src.size()) bytes, which makes failure impossible short of memory.
  std::size_t compress(std::span<const std::byte> src, std::span<std::byte> dst) {
    return check(ZSTD_compress2(ctx_.get(), dst.data(), dst.size(), src.data(), src.size()));
  }

  /// Compresses `src` into one frame at the start of `dst`, starting a new zstd block at each
  /// offset in `breaks` (strictly increasing, each in (0, src.size())), so that sections of
  /// different statistics get Huffman tables of their own; returns the frame's size. The frame
  /// is as standard as compress()'s (a decoder sees only blocks); without breaks it is
  /// compress(). `dst` must hold zstd_sections_bound(src.size(), breaks.size()) bytes.
  std::size_t compress(std::span<const std::byte> src, std::span<const std::size_t> breaks,
                       std::span<std::byte> dst) {
    if (breaks.empty()) return compress(src, dst);
    check(ZSTD_CCtx_reset(ctx_.get(), ZSTD_reset_session_only));
    check(ZSTD_CCtx_setPledgedSrcSize(ctx_.get(), src.size()));
    ZSTD_outBuffer out{dst.data(), dst.size(), 0};
    std::size_t from = 0;
    for (std::size_t k = 0; k <= breaks.size(); ++k) {
      const std::size_t to = k < breaks.size() ? breaks[k] : src.size();
      ZSTD_inBuffer in{src.data() + from, to - from, 0};
      const ZSTD_EndDirective mode = k < breaks.size() ? ZSTD_e_flush : ZSTD_e_end;
      for (;;) {
        const std::size_t before = out.pos + in.pos;
        const std::size_t left = check(ZSTD_compressStream2(ctx_.get(), &out, &in, mode));
        if (left == 0 && in.pos == in.size) break;
        if (out.pos + in.pos == before || out.pos == out.size) [[unlikely]]
          throw error(errc::overflow, "zstd compression: output buffer of " +
                                          std::to_string(dst.size()) + " bytes too small");
      }
      from = to;
    }
    return out.pos;
  }

  /// Appends one frame of `src` to `dst` and returns its size; `dst` grows by the bound first,
  /// then shrinks to what was written, so a warm vector does not reallocate.
  std::size_t compress_append(std::span<const std::byte> src, std::vector<std::byte>& dst) {
    const std::size_t at = dst.size();
    dst.resize(at + zstd_compress_bound(src.size()));
    const std::size_t n = compress(src, std::span<std::byte>(dst).subspan(at));
    dst.resize(at + n);
    return n;
  }

 private:
  static std::size_t check(std::size_t r) {
    if (ZSTD_isError(r)) [[unlikely]] {
      if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation) throw std::bad_alloc();
      throw error(errc::invalid_argument, std::string("zstd compression: ") + ZSTD_getErrorName(r));
    }
    return r;
  }

  struct deleter {
    void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
  };
  std::unique_ptr<ZSTD_CCtx, deleter> ctx_;
  int level_ = 0;
};

/// Owns a ZSTD_DCtx; movable, not copyable. Not thread-safe: one per thread.
class zstd_decompressor {
 public:
  zstd_decompressor() : ctx_(ZSTD_createDCtx()) {
    if (ctx_ == nullptr) throw std::bad_alloc();
  }

  /// Why `src` is not exactly one zstd frame (not a skippable frame, nothing after it) whose
  /// header records content size `expected`, or why `expected` is beyond what `src.size()` bytes
  /// can decode to; empty when it is fine. Reads only the frame and block headers.
  [[nodiscard]] static std::string frame_error(std::span<const std::byte> src,
                                               std::uint64_t expected) {
    if (src.size() < 4 || load_le<std::uint32_t>(src.data()) != ZSTD_MAGICNUMBER) [[unlikely]]
      return "stream is not a zstd frame (bad magic number)";
    const unsigned long long content = ZSTD_getFrameContentSize(src.data(), src.size());
    if (content == ZSTD_CONTENTSIZE_ERROR) [[unlikely]]
      return "zstd frame header is invalid";
    if (content == ZSTD_CONTENTSIZE_UNKNOWN) [[unlikely]]
      return "zstd frame does not record its content size";
    if (content != expected) [[unlikely]]
      return "zstd frame content size " + std::to_string(content) + " differs from the declared " +
             std::to_string(expected) + " bytes";
    if (expected / zstd_max_expansion > src.size()) [[unlikely]]
      return "zstd frame of " + std::to_string(src.size()) + " bytes cannot decode to " +
             std::to_string(expected) + " bytes";
    const std::size_t frame = ZSTD_findFrameCompressedSize(src.data(), src.size());
    if (ZSTD_isError(frame)) [[unlikely]]
      return std::string("zstd frame is malformed: ") + ZSTD_getErrorName(frame);
    if (frame != src.size()) [[unlikely]]
      return "zstd frame ends at byte " + std::to_string(frame) + " of a " +
             std::to_string(src.size()) + "-byte stream";
    return {};
  }

  /// Decompresses `src` into all of `dst`; returns why it failed (frame_error(src, dst.size()),
  /// a decoding error or a size difference), empty on success. `dst` is unspecified on failure.
  [[nodiscard]] std::string try_decompress(std::span<const std::byte> src,
                                           std::span<std::byte> dst) {
    if (auto why = frame_error(src, dst.size()); !why.empty()) [[unlikely]]
      return why;
    const std::size_t n =
        ZSTD_decompressDCtx(ctx_.get(), dst.data(), dst.size(), src.data(), src.size());
    if (ZSTD_isError(n)) [[unlikely]] {
      if (ZSTD_getErrorCode(n) == ZSTD_error_memory_allocation) throw std::bad_alloc();
      return std::string("zstd decompression failed: ") + ZSTD_getErrorName(n);
    }
    if (n != dst.size()) [[unlikely]]
      return "zstd frame decoded to " + std::to_string(n) + " bytes, expected " +
             std::to_string(dst.size());
    return {};
  }

  /// try_decompress, throwing corrupt_payload with the reason.
  void decompress(std::span<const std::byte> src, std::span<std::byte> dst) {
    if (auto why = try_decompress(src, dst); !why.empty()) [[unlikely]]
      fail(why);
  }

  /// Checks the frame against `expected` before touching `dst`, then sizes `dst` to `expected`
  /// (reusing its capacity) and decompresses into it; corrupt_payload on failure.
  void decompress(std::span<const std::byte> src, std::size_t expected,
                  std::vector<std::byte>& dst) {
    if (auto why = frame_error(src, expected); !why.empty()) [[unlikely]]
      fail(why);
    dst.resize(expected);
    decompress(src, std::span<std::byte>(dst));
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    throw error(errc::corrupt_payload, what);
  }

  struct deleter {
    void operator()(ZSTD_DCtx* d) const noexcept { ZSTD_freeDCtx(d); }
  };
  std::unique_ptr<ZSTD_DCtx, deleter> ctx_;
};

}  // namespace dcr::detail
