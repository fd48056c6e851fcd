// dcr/detail/io/delta.inl: the bodies of dcr/io/delta.hpp (included at its end).
#pragma once

namespace dcr::io {

inline digest_stream::digest_stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  reset();
}

inline void digest_stream::update(std::span<const std::byte> bytes) noexcept {
  XXH3_128bits_update(state_, bytes.data(), bytes.size());
}

inline digest128 digest_stream::digest() const noexcept {
  return digest128::from_hash(XXH3_128bits_digest(state_));
}

inline delta_file delta_file::open(const std::filesystem::path& path, container_kind kind) {
  delta_file f;
  f.file_ = mapped_file::open_read(path);
  f.validate(f.file_.bytes(), path.string(), kind);
  return f;
}

inline delta_file delta_file::parse(std::span<const std::byte> bytes, std::string where,
                                    container_kind kind) {
  delta_file f;
  f.validate(bytes, std::move(where), kind);
  return f;
}

inline void delta_file::bind_base(const safetensors_header& base, std::string_view base_json,
                                  std::string_view base_what) {
  DCR_EXPECTS(kind_ == container_kind::delta, errc::invalid_argument,
              where_ + ": a journal is bound to the base header it holds");
  bind(base, base_json, base_what);
}

inline const tensor_registry& delta_file::registry() const {
  require_bound();
  return registry_;
}

inline const digest128& delta_file::base_header_digest() const noexcept {
  return base_header_digest_;
}

inline const digest128& delta_file::target_header_digest() const noexcept {
  return target_header_digest_;
}

inline std::uint64_t delta_file::target_file_size() const noexcept {
  return 8 + target_size_ + tensor_bytes_;
}

inline std::span<const std::byte> delta_file::target_header_code() const noexcept {
  return bytes_.subspan(code_at_, code_size_);
}

inline std::string_view delta_file::target_header_json() const {
  require_bound();
  return target_json_;  // a std::string: a view of it stays valid when the delta_file moves
}

inline const safetensors_header& delta_file::target_header() const {
  require_bound();
  return target_;
}

inline std::span<const std::byte> delta_file::payload(std::size_t i) const {
  DCR_EXPECTS(i < payloads_.size(), errc::out_of_range,
              where_ + ": no payload " + std::to_string(i));
  return bytes_.subspan(payloads_[i].first, payloads_[i].second);
}

inline attempt_key delta_file::expected_transition(std::size_t i) const {
  return is_undo(i) ? delta_format::backward : delta_format::forward;
}

inline void delta_file::require_bound() const {
  DCR_EXPECTS(bound_, errc::not_ready,
              where_ +
                  ": no base bound (the delta's registry and target header come from "
                  "its base: delta_file::bind_base)");
}

inline void delta_file::validate(std::span<const std::byte> bytes, std::string where,
                                 container_kind kind) {
  using dcr::detail::load_le;
  where_ = std::move(where);
  bytes_ = bytes;
  kind_ = kind;
  bound_ = false;
  const std::string& w = where_;
  const char* what = detail::kind_name(kind);
  const auto magic = detail::magic_of(kind);
  DCR_EXPECTS(
      bytes.size() >= 8 && std::memcmp(bytes.data(), magic.data(), 8) == 0, errc::corrupt_payload,
      w + ": not a dcr " + what + " (magic '" + std::string(magic.data(), 8) + "' missing)");
  DCR_EXPECTS(
      bytes.size() >= 12, errc::truncated_payload,
      w + ": " + std::to_string(bytes.size()) + " bytes, shorter than a " + what + " header");
  const std::byte* p = bytes.data();
  const auto version = load_le<std::uint16_t>(p + 8);
  DCR_EXPECTS(version == delta_format::version, errc::unsupported_version,
              w + ": " + what + " format version " + std::to_string(version) +
                  (version < delta_format::version
                       ? " (written by an older dcr; make the delta again with this dcr)"
                       : " (written by a newer dcr)") +
                  ", this dcr reads version " + std::to_string(delta_format::version) + " only");
  DCR_EXPECTS(bytes.size() >= delta_format::header_size + delta_format::trailer_size,
              errc::truncated_payload,
              w + ": " + std::to_string(bytes.size()) + " bytes, shorter than an empty " + what);
  DCR_EXPECTS(load_le<std::uint16_t>(p + 10) == delta_format::header_size, errc::corrupt_payload,
              w + ": header size differs from version 2's " +
                  std::to_string(delta_format::header_size) + " bytes");
  DCR_EXPECTS(load_le<std::uint32_t>(p + 12) == 0, errc::reserved_bits_set,
              w + ": header flags (bytes 12-15) not zero");
  const auto total = load_le<std::uint64_t>(p + 16);
  DCR_EXPECTS(
      total <= bytes.size(), errc::truncated_payload,
      w + ": " + std::to_string(bytes.size()) + " bytes, header declares " + std::to_string(total));
  DCR_EXPECTS(total == bytes.size(), errc::corrupt_payload,
              w + ": " + std::to_string(bytes.size() - total) +
                  " bytes after the declared end at byte " + std::to_string(total));
  fingerprint_ = load_le<std::uint64_t>(p + 24);
  tensor_count_ = load_le<std::uint32_t>(p + 32);
  const auto payload_count = load_le<std::uint32_t>(p + 36);
  const auto undo_count = load_le<std::uint32_t>(p + 40);
  const auto base_size = load_le<std::uint32_t>(p + 44);
  tensor_bytes_ = load_le<std::uint64_t>(p + 48);
  target_size_ = load_le<std::uint64_t>(p + 56);
  const auto code_size = load_le<std::uint64_t>(p + 64);
  base_header_digest_ = detail::load_digest(p + 72);
  target_header_digest_ = detail::load_digest(p + 88);
  base_digest_ = detail::load_digest(p + 104);
  result_digest_ = detail::load_digest(p + 120);
  if (kind == container_kind::delta)
    DCR_EXPECTS(base_size == 0 && undo_count == 0, errc::reserved_bits_set,
                w + ": undo count and base header size (bytes 40-47) not zero in a delta file");
  DCR_EXPECTS(
      undo_count <= payload_count, errc::corrupt_payload,
      w + ": " + std::to_string(undo_count) + " undo payloads of " + std::to_string(payload_count));
  DCR_EXPECTS(tensor_bytes_ <= (std::numeric_limits<std::uint64_t>::max() >> 2) &&
                  target_size_ <= safetensors_max_header_size,
              errc::overflow,
              w + ": tensor bytes " + std::to_string(tensor_bytes_) + " or target header size " +
                  std::to_string(target_size_) + " too large");
  // Sections, checked by subtraction so hostile sizes cannot overflow.
  const std::uint64_t left = total - delta_format::header_size - delta_format::trailer_size;
  DCR_EXPECTS(base_size <= left && code_size <= left - base_size, errc::corrupt_payload,
              w + ": sections of " + std::to_string(base_size) + " + " + std::to_string(code_size) +
                  " bytes overrun the " + std::to_string(total) + "-byte file");
  const std::uint64_t base_at = delta_format::header_size;
  code_at_ = base_at + base_size;
  code_size_ = code_size;
  const std::uint64_t head_end = code_at_ + code_size;
  const std::uint64_t body_end = total - delta_format::trailer_size;
  const auto head_sum = load_le<std::uint64_t>(p + body_end);
  const auto body_sum = load_le<std::uint64_t>(p + body_end + 8);
  DCR_EXPECTS(head_sum == XXH3_64bits(p, head_end), errc::corrupt_payload,
              w + ": checksum of the header and JSON headers (bytes 0.." +
                  std::to_string(head_end) + ") mismatch");
  DCR_EXPECTS(body_sum == XXH3_64bits(p + head_end, body_end - head_end), errc::corrupt_payload,
              w + ": checksum of the payloads (bytes " + std::to_string(head_end) + ".." +
                  std::to_string(body_end) + ") mismatch");

  // The target header's frame: exactly one zstd frame recording N as its content size.
  const auto code = target_header_code();
  const std::size_t frame = ZSTD_findFrameCompressedSize(code.data(), code.size());
  DCR_EXPECTS(!ZSTD_isError(frame) && frame == code.size(), errc::corrupt_payload,
              w + ": the target header (bytes " + std::to_string(code_at_) + ".." +
                  std::to_string(head_end) + ") is not one zstd frame");
  DCR_EXPECTS(ZSTD_getFrameContentSize(code.data(), code.size()) == target_size_,
              errc::corrupt_payload,
              w + ": the target header's zstd frame does not record its " +
                  std::to_string(target_size_) + "-byte size");
  // No byte of a zstd frame decodes to more than zstd_max_expansion bytes: a frame claiming
  // more is refused before bind_base allocates the header.
  DCR_EXPECTS(target_size_ / dcr::detail::zstd_max_expansion <= code.size(), errc::corrupt_payload,
              w + ": a " + std::to_string(code.size()) + "-byte zstd frame cannot hold the " +
                  std::to_string(target_size_) + "-byte target header it claims");

  base_json_ = std::string_view(reinterpret_cast<const char*>(p + base_at), base_size);
  if (kind == container_kind::journal) {
    const auto base = parse_safetensors_header(base_json_, tensor_bytes_, w + " (base header)");
    bind(base, base_json_, w + " (base header)");
  }

  // Payload boundaries: each payload's own header gives its size; together they fill the area.
  payloads_.clear();
  undo_.clear();
  sequence_.clear();
  undo_count_ = 0;
  std::uint64_t at = head_end;
  std::uint32_t forward = 0;
  std::uint32_t backward = 0;
  for (std::uint32_t i = 0; i < payload_count; ++i) {
    const auto rest = bytes.subspan(at, body_end - at);
    const std::string here =
        w + ": payload " + std::to_string(i) + " at byte " + std::to_string(at);
    std::uint64_t size = 0;
    try {
      size = payload_decoder::peek_size(rest);
    } catch (const error& e) {
      throw error(e.dcr_code(), here + ": " + e.what());
    }
    DCR_EXPECTS(size <= rest.size(), errc::truncated_payload,
                here + ": declares " + std::to_string(size) + " bytes, " +
                    std::to_string(rest.size()) + " remain");
    const auto header = payload_decoder::peek_header(rest.first(size));
    const auto& id = header.id.attempt;
    const bool undo = id.base_version == 1 && id.target_version == 0;
    DCR_EXPECTS(kind == container_kind::journal || !undo, errc::stale_payload,
                here + ": an undo payload in a delta file");
    DCR_EXPECTS(header.registry_fingerprint == fingerprint_, errc::registry_mismatch,
                here + ": registry fingerprint differs from the header's");
    payloads_.emplace_back(at, size);
    undo_.push_back(undo);
    sequence_.push_back(undo ? backward++ : forward++);
    at += size;
  }
  undo_count_ = backward;
  DCR_EXPECTS(at == body_end, errc::corrupt_payload,
              w + ": payloads end at byte " + std::to_string(at) + ", the trailer is at byte " +
                  std::to_string(body_end));
  DCR_EXPECTS(undo_count_ == undo_count, errc::corrupt_payload,
              w + ": " + std::to_string(undo_count_) + " undo payloads, header declares " +
                  std::to_string(undo_count));
}

inline void delta_file::bind(const safetensors_header& base, std::string_view base_json,
                             std::string_view base_what) {
  const std::string what(base_what);
  registry_ = tensor_registry(base.canonical_tensors());
  DCR_EXPECTS(registry_.fingerprint() == fingerprint_ && registry_.size() == tensor_count_,
              errc::registry_mismatch,
              what + " holds other tensors than the base of " + where_ + " (" +
                  std::to_string(registry_.size()) + " tensors, registry fingerprint " +
                  hex64(registry_.fingerprint()) +
                  "; the delta's base: " + std::to_string(tensor_count_) + " tensors, " +
                  hex64(fingerprint_) + "): names, dtypes or shapes differ");
  const auto content = header_content(base_json);
  const auto base_digest = header_content_digest(base_json);
  DCR_EXPECTS(base_digest == base_header_digest_, errc::verification_failed,
              "wrong base: " + what + ": its JSON header has digest " + base_digest.hex() +
                  ", the base header of " + where_ + " " + base_header_digest_.hex() +
                  " (same tensors, but another tensor order, offsets or metadata: the "
                  "delta's target header is coded against its base's header, so only that "
                  "base can be used)");
  std::string target(static_cast<std::size_t>(target_size_), '\0');
  std::unique_ptr<ZSTD_DCtx, detail::zstd_dctx_deleter> ctx(ZSTD_createDCtx());
  if (!ctx) throw std::bad_alloc();
  const auto code = target_header_code();
  const std::size_t n =
      ZSTD_decompress_usingDict(ctx.get(), target.data(), target.size(), code.data(), code.size(),
                                content.data(), content.size());
  DCR_EXPECTS(!ZSTD_isError(n) && n == target.size(), errc::corrupt_payload,
              where_ + ": the target header does not decode against " + what + "'s header" +
                  (ZSTD_isError(n) ? std::string(": ") + ZSTD_getErrorName(n) : std::string()));
  DCR_EXPECTS(header_content_digest(target) == target_header_digest_, errc::corrupt_payload,
              where_ + ": the decoded target header has digest " +
                  header_content_digest(target).hex() + ", the recorded " +
                  target_header_digest_.hex());
  auto parsed = parse_safetensors_header(target, tensor_bytes_, where_ + " (target header)");
  DCR_EXPECTS(parsed.tensors().size() == registry_.size(), errc::corrupt_payload,
              where_ + ": the target header has " + std::to_string(parsed.tensors().size()) +
                  " tensors, the base " + std::to_string(registry_.size()));
  for (const auto& t : registry_.tensors()) {
    const auto* e = parsed.find(t.name);
    DCR_EXPECTS(e != nullptr && e->type == t.type && e->shape == t.shape, errc::corrupt_payload,
                where_ + ": tensor '" + t.name +
                    "' of the base is not in the target header as the same dtype and shape");
  }
  target_json_ = std::move(target);
  target_ = std::move(parsed);
  bound_ = true;
}

inline std::string delta_file::hex64(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}

inline void delta_payloads::decode(std::size_t i, std::vector<item>& items) {
  const auto expect = d_.expected_transition(i);
  const bool undo = d_.is_undo(i);
  const std::string where = d_.where() + ": payload " + std::to_string(i) + " at byte " +
                            std::to_string(d_.payload_offset(i));
  auto& next = next_[undo ? 1 : 0];
  DCR_EXPECTS(
      i >= next, errc::invalid_argument,
      where + ": decoded out of order (payload " + std::to_string(next) + " or later expected)");
  next = i + 1;
  payload_header h;
  try {
    h = decoder_.decode(d_.payload(i), d_.registry(), items, &expect);
  } catch (const error& e) {
    throw error(e.dcr_code(), where + ": " + e.what());
  }
  DCR_EXPECTS(h.id.owner == 0 && h.id.sequence == d_.expected_sequence(i), errc::duplicate_payload,
              where + ": owner " + std::to_string(h.id.owner) + " sequence " +
                  std::to_string(h.id.sequence) + ", expected owner 0 sequence " +
                  std::to_string(d_.expected_sequence(i)) + " (payloads reordered or duplicated)");
  auto& last = last_[undo ? 1 : 0];
  auto& seen = seen_[undo ? 1 : 0];
  for (const auto& it : items) {
    DCR_EXPECTS(d_.kind() != container_kind::journal || it.enc == encoding::overwrite,
                errc::corrupt_payload,
                where + ": journal item of tensor id " + std::to_string(it.tensor) +
                    " is not an overwrite item");
    if (it.indices.empty()) continue;
    DCR_EXPECTS(!seen[it.tensor] || it.indices.front() > last[it.tensor], errc::corrupt_payload,
                where + ": tensor '" + d_.registry().tensors()[it.tensor].name + "' element " +
                    std::to_string(it.indices.front()) + " comes after element " +
                    std::to_string(last[it.tensor]) +
                    " of an earlier payload (each element may be listed once, in increasing "
                    "order across payloads)");
    seen[it.tensor] = true;
    last[it.tensor] = it.indices.back();
  }
}

inline delta_writer::delta_writer(const std::filesystem::path& target, container_kind kind,
                                  const tensor_registry& registry,
                                  std::string_view target_header_json,
                                  std::string_view base_header_json)
    : kind_(kind),
      fingerprint_(registry.fingerprint()),
      tensor_count_(static_cast<std::uint32_t>(registry.size())),
      target_size_(target_header_json.size()),
      base_header_digest_(header_content_digest(base_header_json)),
      target_header_digest_(header_content_digest(target_header_json)),
      out_(target) {
  DCR_EXPECTS(registry.size() <= std::numeric_limits<std::uint32_t>::max(), errc::overflow,
              "delta_writer: too many tensors");
  DCR_EXPECTS(target_header_json.size() <= safetensors_max_header_size &&
                  base_header_json.size() <= safetensors_max_header_size,
              errc::overflow, "delta_writer: JSON header too large");
  for (const auto& t : registry.tensors()) tensor_bytes_ += static_cast<std::uint64_t>(t.bytes());
  if (kind == container_kind::journal) base_json_ = base_header_json;
  code_ = detail::code_target_header(target_header_json, header_content(base_header_json));
  head_end_ = delta_format::header_size + base_json_.size() + code_.size();
  at_ = head_end_;
  body_hash_ = XXH3_createState();
  if (body_hash_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(body_hash_);
}

inline void delta_writer::set_digests(const digest128& base, const digest128& result) {
  base_digest_ = base;
  result_digest_ = result;
}

inline void delta_writer::append_payload(std::span<const std::byte> payload) {
  DCR_EXPECTS(!finished_, errc::not_ready, "delta_writer: payload appended after finish()");
  const auto id = payload_decoder::peek_header(payload).id.attempt;
  const bool undo = id.base_version == 1 && id.target_version == 0;
  DCR_EXPECTS(!undo || kind_ == container_kind::journal, errc::invalid_argument,
              "delta_writer: undo payload in a delta file");
  DCR_EXPECTS(payloads_ < std::numeric_limits<std::uint32_t>::max(), errc::overflow,
              "delta_writer: too many payloads");
  out_.write_at(payload, at_);
  XXH3_64bits_update(body_hash_, payload.data(), payload.size());
  at_ += payload.size();
  ++payloads_;
  undo_payloads_ += undo ? 1 : 0;
}

inline std::uint64_t delta_writer::size() const noexcept {
  return at_ + (finished_ ? 0 : delta_format::trailer_size);
}

inline const std::filesystem::path& delta_writer::temp_path() const noexcept {
  return out_.temp_path();
}

inline void delta_writer::finish() {
  if (finished_) return;
  std::vector<std::byte> head(head_end_);
  std::byte* p = head.data();
  using dcr::detail::store_le;
  const auto magic = detail::magic_of(kind_);
  std::memcpy(p, magic.data(), 8);
  store_le<std::uint16_t>(p + 8, delta_format::version);
  store_le<std::uint16_t>(p + 10, delta_format::header_size);
  store_le<std::uint32_t>(p + 12, 0);
  const std::uint64_t total = at_ + delta_format::trailer_size;
  store_le<std::uint64_t>(p + 16, total);
  store_le<std::uint64_t>(p + 24, fingerprint_);
  store_le<std::uint32_t>(p + 32, tensor_count_);
  store_le<std::uint32_t>(p + 36, payloads_);
  store_le<std::uint32_t>(p + 40, undo_payloads_);
  store_le<std::uint32_t>(p + 44, static_cast<std::uint32_t>(base_json_.size()));
  store_le<std::uint64_t>(p + 48, tensor_bytes_);
  store_le<std::uint64_t>(p + 56, target_size_);
  store_le<std::uint64_t>(p + 64, code_.size());
  std::memcpy(p + 72, base_header_digest_.bytes.data(), 16);
  std::memcpy(p + 88, target_header_digest_.bytes.data(), 16);
  std::memcpy(p + 104, base_digest_.bytes.data(), 16);
  std::memcpy(p + 120, result_digest_.bytes.data(), 16);
  std::byte* q = p + delta_format::header_size;
  if (!base_json_.empty()) std::memcpy(q, base_json_.data(), base_json_.size());
  q += base_json_.size();
  std::memcpy(q, code_.data(), code_.size());
  std::byte trailer[delta_format::trailer_size];
  store_le<std::uint64_t>(trailer, XXH3_64bits(head.data(), head.size()));
  store_le<std::uint64_t>(trailer + 8, XXH3_64bits_digest(body_hash_));
  out_.write_at(head, 0);
  out_.write_at(trailer, at_);
  at_ += delta_format::trailer_size;
  out_.sync();
  finished_ = true;
}

inline std::uint64_t delta_writer::commit() {
  finish();
  out_.commit();
  return at_;
}

}  // namespace dcr::io

namespace dcr::io::detail {

inline std::span<const char> magic_of(container_kind kind) {
  return kind == container_kind::delta ? std::span<const char>(delta_format::delta_magic)
                                       : std::span<const char>(delta_format::journal_magic);
}

inline const char* kind_name(container_kind kind) {
  return kind == container_kind::delta ? "delta file" : "journal";
}

inline digest128 load_digest(const std::byte* p) noexcept {
  digest128 d;
  std::memcpy(d.bytes.data(), p, 16);
  return d;
}

inline std::vector<std::byte> code_target_header(std::string_view target,
                                                 std::string_view dictionary) {
  std::unique_ptr<ZSTD_CCtx, zstd_cctx_deleter> ctx(ZSTD_createCCtx());
  if (!ctx) throw std::bad_alloc();
  std::vector<std::byte> out(ZSTD_compressBound(target.size()));
  const std::size_t n = ZSTD_compress_usingDict(ctx.get(), out.data(), out.size(), target.data(),
                                                target.size(), dictionary.data(), dictionary.size(),
                                                delta_format::target_header_level);
  DCR_EXPECTS(!ZSTD_isError(n), errc::invalid_argument,
              std::string("delta_writer: coding the target header: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

}  // namespace dcr::io::detail
