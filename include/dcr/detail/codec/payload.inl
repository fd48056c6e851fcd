// dcr/detail/codec/payload.inl: the bodies of dcr/codec/payload.hpp (included at its end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

namespace dcr {

DCR_INLINE std::size_t payload_encoder::max_encoded_size(std::span<const item> items) {
  std::size_t n = payload_format::header_size + items.size() * payload_format::entry_size +
                  payload_format::trailer_size;
  for (const item& it : items)
    n += coding_planner::location_frame_bound(it.count()) +
         coding_planner::value_frame_bound(it.count(), it.word_bytes());
  return n;
}

DCR_INLINE void payload_encoder::encode(const payload_header& header, std::span<const item> items,
                                        const tensor_registry& registry,
                                        std::vector<std::byte>& out) {
  stage(header, items, registry, staged_);
  finish(staged_, out);
}

DCR_INLINE void payload_encoder::stage(const payload_header& header, std::span<const item> items,
                                       const tensor_registry& registry, staged_payload& staged) {
  DCR_EXPECTS(header.registry_fingerprint == registry.fingerprint(), errc::invalid_argument,
              "payload_encoder: header registry fingerprint differs from the registry's");
  DCR_EXPECTS(items.size() <= std::numeric_limits<std::uint32_t>::max(), errc::overflow,
              "payload_encoder: " + std::to_string(items.size()) + " items exceed 2^32 - 1");

  // Check every item and bound every stream, before writing anything.
  ids_.resize(items.size());
  runs_.resize(items.size());
  std::size_t bound = payload_format::header_size + items.size() * payload_format::entry_size +
                      payload_format::trailer_size;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const item& it = items[i];
    const auto where = [&] {
      return "payload_encoder: " + detail::entry_where(i, it.tensor, &registry);
    };
    DCR_EXPECTS(it.tensor < registry.size(), errc::unknown_tensor, where() + ": unknown tensor");
    const canonical_tensor& t = registry.tensors()[it.tensor];
    DCR_EXPECTS(it.type == t.type, errc::dtype_mismatch,
                where() + ": dtype " + std::string(dtype_name(it.type)) + ", registry has " +
                    std::string(dtype_name(t.type)));
    DCR_EXPECTS(
        is_supported_encoding(it.enc), errc::invalid_argument,
        where() + ": encoding " + std::to_string(static_cast<int>(it.enc)) + " is not supported");
    DCR_EXPECTS(it.values.size() == it.count() * it.word_bytes(), errc::invalid_argument,
                where() + ": " + std::to_string(it.values.size()) + " value bytes for " +
                    std::to_string(it.count()) + " records");
    const auto numel = static_cast<std::uint64_t>(t.numel());
    // One branch-free pass (it runs at memory speed) finds whether the indices are strictly
    // increasing and counts runs; only a failure walks them again to name the record.
    const std::uint64_t* const idx = it.indices.data();
    const std::size_t n = it.indices.size();
    std::size_t runs = n == 0 ? 0 : 1;
    bool increasing = true;
    for (std::size_t j = 1; j < n; ++j) {
      increasing &= idx[j] > idx[j - 1];
      runs += idx[j] != idx[j - 1] + 1 ? 1 : 0;
    }
    if (!increasing) [[unlikely]] {
      for (std::size_t j = 1; j < n; ++j)
        DCR_EXPECTS(idx[j] > idx[j - 1], errc::invalid_argument,
                    where() + ": indices not strictly increasing at record " + std::to_string(j));
    }
    DCR_EXPECTS(n == 0 || idx[n - 1] < numel, errc::out_of_range,
                where() + ": index " + std::to_string(n == 0 ? 0 : idx[n - 1]) + " at record " +
                    std::to_string(n - 1) + " >= numel " + std::to_string(numel));
    runs_[i] = runs;
    ids_[i] = {it.tensor, static_cast<std::uint32_t>(i)};
    bound += coding_planner::location_frame_bound(it.count()) +
             coding_planner::value_frame_bound(it.count(), it.word_bytes());
  }
  std::sort(ids_.begin(), ids_.end());
  for (std::size_t k = 1; k < ids_.size(); ++k)
    DCR_EXPECTS(ids_[k - 1].first != ids_[k].first, errc::invalid_argument,
                "payload_encoder: items " + std::to_string(ids_[k - 1].second) + " and " +
                    std::to_string(ids_[k].second) + " both name tensor '" +
                    registry.tensors()[ids_[k].first].name + "'");

  // Choose and write every stream.
  staged.header_ = header;
  staged.entries_.resize(items.size());
  staged.streams_.resize(2 * items.size());
  staged.used_ = 0;
  staged.bound_ = bound;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const item& it = items[i];
    item_entry& e = staged.entries_[i];
    e = item_entry{};
    e.tensor = it.tensor;
    e.dtype_code = static_cast<std::uint8_t>(it.type);
    e.encoding_code = static_cast<std::uint8_t>(it.enc);
    e.count = it.count();
    e.numel = static_cast<std::uint64_t>(registry.tensors()[it.tensor].numel());
    const stream_choice loc = planner_.plan_locations(it.indices, runs_[i]);
    keep(staged, staged.streams_[2 * i], loc);
    e.location_code = loc.coding;
    e.location_raw_size = loc.raw_size;
    const stream_choice val = visit_word(it.word_bytes(), [&]<class W>(W) {
      return planner_.plan_values<W>(it.values.data(), it.count());
    });
    keep(staged, staged.streams_[2 * i + 1], val);
    e.value_code = val.coding;
    e.value_raw_size = val.raw_size;
  }
}

DCR_INLINE void payload_encoder::finish(const staged_payload& staged, std::vector<std::byte>& out) {
  const std::size_t count = staged.entries_.size();
  if (body_size_ < staged.bound_) {
    // Not zero-filled: the bound is several times what is written, and a page of it is
    // touched only where the payload lands (a cold encoder would fault in all of it).
    body_.reset(new std::byte[staged.bound_]);
    body_size_ = staged.bound_;
  }
  std::size_t pos = payload_format::header_size + count * payload_format::entry_size;
  for (std::size_t i = 0; i < count; ++i) {
    item_entry e = staged.entries_[i];
    e.location_size = emit(staged, staged.streams_[2 * i], pos);
    pos += static_cast<std::size_t>(e.location_size);
    e.value_size = emit(staged, staged.streams_[2 * i + 1], pos);
    pos += static_cast<std::size_t>(e.value_size);
    write_entry(body_.get() + payload_format::header_size + i * payload_format::entry_size, e);
  }
  const std::size_t total = pos + payload_format::trailer_size;
  write_header(body_.get(), staged.header_, static_cast<std::uint32_t>(count), total);
  detail::store_le<std::uint64_t>(body_.get() + pos, XXH3_64bits(body_.get(), pos));
  out.resize(total);
  std::memcpy(out.data(), body_.get(), total);
}

DCR_INLINE void payload_encoder::keep(staged_payload& staged, staged_payload::stream& st,
                                      const stream_choice& c) {
  st.coding = c.coding;
  st.raw_size = c.raw_size;
  st.compressed = c.compressed;
  const std::span<const std::byte> bytes = c.compressed ? planner_.frame() : planner_.raw().bytes();
  st.offset = staged.used_;
  st.size = bytes.size();
  st.section_count = 0;
  if (!c.compressed)
    for (const std::size_t b : planner_.raw().sections()) st.sections[st.section_count++] = b;
  if (staged.bytes_.size() < staged.used_ + bytes.size())
    staged.bytes_.resize(
        std::max(staged.used_ + bytes.size(), staged.bytes_.size() + staged.bytes_.size() / 2));
  if (!bytes.empty()) std::memcpy(staged.bytes_.data() + staged.used_, bytes.data(), bytes.size());
  staged.used_ += bytes.size();
}

DCR_INLINE std::uint64_t payload_encoder::emit(const staged_payload& staged,
                                               const staged_payload::stream& st, std::size_t pos) {
  const std::span<const std::byte> bytes(staged.bytes_.data() + st.offset, st.size);
  if (st.compressed) {
    std::memcpy(body_.get() + pos, bytes.data(), bytes.size());
    return bytes.size();
  }
  return planner_.compress(bytes,
                           std::span<const std::size_t>(st.sections.data(), st.section_count),
                           std::span<std::byte>(body_.get() + pos, body_size_ - pos));
}

DCR_INLINE void payload_encoder::write_header(std::byte* p, const payload_header& h,
                                              std::uint32_t count, std::uint64_t total) noexcept {
  using detail::store_le;
  std::memset(p, 0, payload_format::header_size);  // flags and reserved fields are zero
  store_le<std::uint32_t>(p + 0, payload_format::magic);
  store_le<std::uint16_t>(p + 4, payload_format::version);
  store_le<std::uint16_t>(p + 8, payload_format::header_size);
  store_le<std::uint16_t>(p + 10, payload_format::entry_size);
  store_le<std::uint64_t>(p + 16, h.registry_fingerprint);
  store_le<std::uint64_t>(p + 24, h.id.attempt.base_version);
  store_le<std::uint64_t>(p + 32, h.id.attempt.target_version);
  store_le<std::uint32_t>(p + 40, h.id.attempt.number);
  store_le<std::uint32_t>(p + 44, h.id.owner);
  store_le<std::uint32_t>(p + 48, h.id.sequence);
  store_le<std::uint32_t>(p + 52, count);
  store_le<std::uint64_t>(p + 56, total);
}

DCR_INLINE void payload_encoder::write_entry(std::byte* p, const item_entry& e) noexcept {
  using detail::store_le;
  store_le<std::uint32_t>(p + 0, e.tensor);
  store_le<std::uint8_t>(p + 4, e.dtype_code);
  store_le<std::uint8_t>(p + 5, e.encoding_code);
  store_le<std::uint8_t>(p + 6, e.location_code);
  store_le<std::uint8_t>(p + 7, e.value_code);
  store_le<std::uint64_t>(p + 8, e.count);
  store_le<std::uint64_t>(p + 16, e.numel);
  store_le<std::uint64_t>(p + 24, e.location_size);
  store_le<std::uint64_t>(p + 32, e.location_raw_size);
  store_le<std::uint64_t>(p + 40, e.value_size);
  store_le<std::uint64_t>(p + 48, e.value_raw_size);
  store_le<std::uint64_t>(p + 56, 0);  // reserved
}

DCR_INLINE payload_header payload_decoder::peek_header(std::span<const std::byte> bytes) {
  return read_header(bytes).header;
}

DCR_INLINE std::uint64_t payload_decoder::peek_size(std::span<const std::byte> prefix) {
  return read_header(prefix, header_scope::prefix).total;
}

DCR_INLINE payload_header payload_decoder::read_table(std::span<const std::byte> bytes,
                                                      std::vector<item_entry>& entries) {
  const header_fields h = read_header(bytes, header_scope::checksummed);
  const auto body = static_cast<std::size_t>(h.total - payload_format::trailer_size);

  entries.resize(h.count);
  std::uint64_t pos = payload_format::header_size + h.count * payload_format::entry_size;
  for (std::size_t i = 0; i < h.count; ++i) {
    const std::byte* p =
        bytes.data() + payload_format::header_size + i * payload_format::entry_size;
    item_entry& e = entries[i];
    e.tensor = detail::load_le<std::uint32_t>(p + 0);
    e.dtype_code = detail::load_le<std::uint8_t>(p + 4);
    e.encoding_code = detail::load_le<std::uint8_t>(p + 5);
    e.location_code = detail::load_le<std::uint8_t>(p + 6);
    e.value_code = detail::load_le<std::uint8_t>(p + 7);
    e.count = detail::load_le<std::uint64_t>(p + 8);
    e.numel = detail::load_le<std::uint64_t>(p + 16);
    e.location_size = detail::load_le<std::uint64_t>(p + 24);
    e.location_raw_size = detail::load_le<std::uint64_t>(p + 32);
    e.value_size = detail::load_le<std::uint64_t>(p + 40);
    e.value_raw_size = detail::load_le<std::uint64_t>(p + 48);
    DCR_EXPECTS(detail::load_le<std::uint64_t>(p + 56) == 0, errc::reserved_bits_set,
                "payload: " + detail::entry_where(i, e.tensor, nullptr) + ": reserved field set");
    // Subtractions from what is left cannot overflow, unlike sums of hostile sizes.
    DCR_EXPECTS(e.location_size <= body - pos && e.value_size <= body - pos - e.location_size,
                errc::corrupt_payload,
                "payload: " + detail::entry_where(i, e.tensor, nullptr) + ": streams of " +
                    std::to_string(e.location_size) + " + " + std::to_string(e.value_size) +
                    " bytes at byte " + std::to_string(pos) +
                    " overrun the stream area ending at " + std::to_string(body));
    e.location_offset = pos;
    e.value_offset = pos + e.location_size;
    pos = e.value_offset + e.value_size;
  }
  DCR_EXPECTS(pos == body, errc::corrupt_payload,
              "payload: streams end at byte " + std::to_string(pos) + ", checksum is at byte " +
                  std::to_string(body));
  return h.header;
}

DCR_INLINE payload_header payload_decoder::decode(std::span<const std::byte> bytes,
                                                  const tensor_registry& registry,
                                                  std::vector<item>& items,
                                                  const attempt_key* expect) {
  const payload_header header = read_table(bytes, entries_);
  if (expect != nullptr) {
    DCR_EXPECTS(
        header.id.attempt == *expect, errc::stale_payload,
        "payload: of attempt " + to_string(header.id.attempt) + ", expected " + to_string(*expect));
  }
  DCR_EXPECTS(header.registry_fingerprint == registry.fingerprint(), errc::registry_mismatch,
              "payload: registry fingerprint differs from the receiver's (built for another "
              "model)");

  // Pass 1: every entry against the registry and every frame header, before any allocation
  // sized by the payload.
  ids_.resize(entries_.size());
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const item_entry& e = entries_[i];
    const auto where = [&] { return "payload: " + detail::entry_where(i, e.tensor, &registry); };
    DCR_EXPECTS(e.tensor < registry.size(), errc::unknown_tensor,
                where() + ": tensor id not in the registry of " + std::to_string(registry.size()) +
                    " tensors");
    const canonical_tensor& t = registry.tensors()[e.tensor];
    DCR_EXPECTS(e.dtype_code == static_cast<std::uint8_t>(t.type), errc::dtype_mismatch,
                where() + ": dtype code " + std::to_string(e.dtype_code) + ", registry has " +
                    std::string(dtype_name(t.type)));
    DCR_EXPECTS(
        e.encoding_code < 0x80 && is_supported_encoding(static_cast<encoding>(e.encoding_code)),
        errc::unsupported_version,
        where() + ": encoding " + std::to_string(e.encoding_code) + " is not supported");
    DCR_EXPECTS(
        detail::is_known_location_coding(e.location_code), errc::unsupported_version,
        where() + ": location coding " + std::to_string(e.location_code) + " is not supported");
    DCR_EXPECTS(detail::is_known_value_coding(e.value_code), errc::unsupported_version,
                where() + ": value coding " + std::to_string(e.value_code) + " is not supported");
    const auto numel = static_cast<std::uint64_t>(t.numel());
    DCR_EXPECTS(
        e.numel == numel, errc::shape_mismatch,
        where() + ": numel " + std::to_string(e.numel) + ", registry has " + std::to_string(numel));
    DCR_EXPECTS(e.count <= numel, errc::overflow,
                where() + ": " + std::to_string(e.count) + " records exceed numel " +
                    std::to_string(numel));
    DCR_EXPECTS(e.count <= detail::max_entry_count, errc::overflow,
                where() + ": record count " + std::to_string(e.count) + " exceeds 2^56");
    const std::uint64_t word = dtype_size(t.type);
    const auto vcoding = static_cast<value_coding>(e.value_code);
    DCR_EXPECTS(detail::value_raw_size_plausible(vcoding, e.value_raw_size, e.count, word),
                errc::corrupt_payload,
                where() + ": value stream of " + std::to_string(e.value_raw_size) +
                    " raw bytes cannot hold " + std::to_string(e.count) + " words of " +
                    std::to_string(word) + " bytes in value coding " +
                    std::to_string(e.value_code));
    const auto lcoding = static_cast<location_coding>(e.location_code);
    DCR_EXPECTS(detail::location_raw_size_plausible(lcoding, e.location_raw_size, e.count, numel),
                errc::corrupt_payload,
                where() + ": location stream of " + std::to_string(e.location_raw_size) +
                    " raw bytes cannot hold " + std::to_string(e.count) +
                    " records in location coding " + std::to_string(e.location_code));
    check_frame(bytes, e.location_offset, e.location_size, e.location_raw_size, where, "location");
    check_frame(bytes, e.value_offset, e.value_size, e.value_raw_size, where, "value");
    ids_[i] = {e.tensor, static_cast<std::uint32_t>(i)};
  }
  std::sort(ids_.begin(), ids_.end());
  for (std::size_t k = 1; k < ids_.size(); ++k)
    DCR_EXPECTS(ids_[k - 1].first != ids_[k].first, errc::corrupt_payload,
                "payload: items " + std::to_string(ids_[k - 1].second) + " and " +
                    std::to_string(ids_[k].second) + " both name tensor '" +
                    registry.tensors()[ids_[k].first].name + "'");

  // Pass 2: decompress and decode into decoded_, which trades places with `items` at the end.
  decoded_.resize(entries_.size());
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const item_entry& e = entries_[i];
    const auto where = [&] { return "payload: " + detail::entry_where(i, e.tensor, &registry); };
    item& it = decoded_[i];
    it.tensor = e.tensor;
    it.type = static_cast<dtype>(e.dtype_code);
    it.enc = static_cast<encoding>(e.encoding_code);
    const auto count = static_cast<std::size_t>(e.count);

    decompress(bytes, e.location_offset, e.location_size, scratch_, e.location_raw_size, where,
               "location");
    it.indices.resize(count);
    const auto stream_where = [&] {
      return where() + ": location stream at byte " + std::to_string(e.location_offset);
    };
    detail::read_locations(static_cast<location_coding>(e.location_code), scratch_, e.count,
                           e.numel, it.indices.data(), stream_where);

    const auto coding = static_cast<value_coding>(e.value_code);
    const bool direct = coding == value_coding::raw ||
                        (dtype_size(it.type) == 1 && coding == value_coding::byte_planes);
    if (direct && std::endian::native == std::endian::little) {
      decompress(bytes, e.value_offset, e.value_size, it.values, e.value_raw_size, where, "value");
    } else {
      decompress(bytes, e.value_offset, e.value_size, scratch_, e.value_raw_size, where, "value");
      it.values.resize(count * dtype_size(it.type));
      const auto value_where = [&] {
        return where() + ": value stream at byte " + std::to_string(e.value_offset);
      };
      visit_word(dtype_size(it.type), [&]<class W>(W) {
        detail::read_values<W>(coding, scratch_, count, it.values.data(), value_where);
      });
    }
  }
  items.swap(decoded_);
  return header;
}

DCR_INLINE payload_decoder::header_fields payload_decoder::read_header(
    std::span<const std::byte> bytes, header_scope scope) {
  using detail::load_le;
  const std::byte* p = bytes.data();
  DCR_EXPECTS(bytes.size() < 4 || load_le<std::uint32_t>(p) == payload_format::magic,
              errc::corrupt_payload, "payload: bad magic (not a dcr payload)");
  DCR_EXPECTS(bytes.size() >= payload_format::header_size, errc::truncated_payload,
              "payload: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                  std::to_string(payload_format::header_size) + "-byte header");
  const auto version = load_le<std::uint16_t>(p + 4);
  DCR_EXPECTS(version == payload_format::version, errc::unsupported_version,
              "payload: format version " + std::to_string(version) + ", this decoder reads " +
                  std::to_string(payload_format::version));
  DCR_EXPECTS(load_le<std::uint16_t>(p + 8) == payload_format::header_size &&
                  load_le<std::uint16_t>(p + 10) == payload_format::entry_size,
              errc::corrupt_payload, "payload: header or entry size differs from version 1's");
  const auto total = load_le<std::uint64_t>(p + 56);
  const auto count = load_le<std::uint32_t>(p + 52);
  const auto entries_fit = [&] {
    return payload_format::header_size + std::uint64_t{count} * payload_format::entry_size +
               payload_format::trailer_size <=
           total;
  };
  const auto entries_error = [&] {
    return "payload: " + std::to_string(count) + " item entries do not fit in " +
           std::to_string(total) + " bytes";
  };
  if (scope != header_scope::prefix) {
    DCR_EXPECTS(total <= bytes.size(), errc::truncated_payload,
                "payload: " + std::to_string(bytes.size()) + " bytes, header declares " +
                    std::to_string(total));
    DCR_EXPECTS(total == bytes.size(), errc::corrupt_payload,
                "payload: " + std::to_string(bytes.size() - total) +
                    " bytes after the declared end at byte " + std::to_string(total));
  }
  if (scope == header_scope::checksummed) {
    DCR_EXPECTS(total >= payload_format::header_size + payload_format::trailer_size, errc::overflow,
                entries_error());
    const auto body = static_cast<std::size_t>(total - payload_format::trailer_size);
    DCR_EXPECTS(load_le<std::uint64_t>(p + body) == XXH3_64bits(p, body), errc::corrupt_payload,
                "payload: checksum mismatch (trailer at byte " + std::to_string(body) + ")");
  }
  bool reserved_zero = load_le<std::uint16_t>(p + 6) == 0 && load_le<std::uint32_t>(p + 12) == 0;
  for (std::size_t k = 64; k < payload_format::header_size; ++k)
    reserved_zero = reserved_zero && p[k] == std::byte{0};
  DCR_EXPECTS(reserved_zero, errc::reserved_bits_set,
              "payload: header flags or reserved bytes (6-7, 12-15, 64-79) not zero");
  DCR_EXPECTS(entries_fit(), errc::overflow, entries_error());
  header_fields h;
  h.header.registry_fingerprint = load_le<std::uint64_t>(p + 16);
  h.header.id.attempt.base_version = load_le<std::uint64_t>(p + 24);
  h.header.id.attempt.target_version = load_le<std::uint64_t>(p + 32);
  h.header.id.attempt.number = load_le<std::uint32_t>(p + 40);
  h.header.id.owner = load_le<std::uint32_t>(p + 44);
  h.header.id.sequence = load_le<std::uint32_t>(p + 48);
  h.count = count;
  h.total = total;
  return h;
}

}  // namespace dcr

namespace dcr::detail {

DCR_INLINE std::string entry_where(std::size_t i, tensor_id tensor,
                                   const tensor_registry* registry) {
  std::string s = "item " + std::to_string(i) + " (tensor id " + std::to_string(tensor);
  if (registry != nullptr && tensor < registry->size())
    s += " '" + registry->tensors()[tensor].name + "'";
  return s + ", entry at byte " +
         std::to_string(payload_format::header_size + i * payload_format::entry_size) + ")";
}

}  // namespace dcr::detail

#endif  // DCR_HEADER_BODIES
