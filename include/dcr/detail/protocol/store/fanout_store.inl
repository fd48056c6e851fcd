// dcr/detail/protocol/store/fanout_store.inl: the bodies of dcr/protocol/store/fanout_store.hpp (included at
// its end).
#pragma once

namespace dcr {

template <payload_store Remote, payload_store Local>
fanout_store<Remote, Local>::fanout_store(Remote& remote, Local& local, directory_claims& claims,
                                          fanout_options options)
    : remote_(&remote), local_(&local), claims_(&claims), options_(options) {
  DCR_EXPECTS(options_.nodes >= 1 && options_.node < options_.nodes, errc::invalid_argument,
              "fanout_store: node " + std::to_string(options_.node) + " is not one of " +
                  std::to_string(options_.nodes) + " nodes");
  DCR_EXPECTS(options_.check_retries >= 0, errc::invalid_argument,
              "fanout_store: check_retries must be >= 0");
}

template <payload_store Remote, payload_store Local>
void fanout_store<Remote, Local>::put_manifest(const attempt_key& key, std::uint32_t owner,
                                               std::span<const payload_id> ids) {
  remote_->put_manifest(key, owner, ids);
}

template <payload_store Remote, payload_store Local>
get_status fanout_store<Remote, Local>::get(const payload_id& id, std::vector<std::byte>& out,
                                            const get_control& control) const {
  if (control.fresh) {  // a refetch: the copy the receiver had failed; never the local one
    ++fresh_gets_;
    return download(id, out, control);
  }
  if (local_->get(id, out) == get_status::found) {
    ++local_hits_;
    forget(id);
    return get_status::found;
  }
  const bool mine = share_of(id, options_.nodes) == options_.node;
  if (!mine && !overdue(id)) return get_status::absent;
  const auto claim = claims_->try_claim(id);
  if (!claim.held()) return get_status::absent;  // another node is downloading it
  // Forwarded between our local miss and the claim?
  if (local_->get(id, out) == get_status::found) {
    ++local_hits_;
    forget(id);
    return get_status::found;
  }
  if (download(id, out, control) == get_status::absent) return get_status::absent;
  local_->put(id, out);  // checked: what the whole node reads
  ++remote_gets_;
  remote_bytes_ += out.size();
  if (!mine) ++takeovers_;
  forget(id);
  return get_status::found;
}

template <payload_store Remote, payload_store Local>
get_status fanout_store<Remote, Local>::download(const payload_id& id, std::vector<std::byte>& out,
                                                 const get_control& control) const {
  for (int attempt = 0;; ++attempt) {
    if (get_with(*remote_, id, out, control) == get_status::absent) return get_status::absent;
    if (options_.check == fanout_check::none) return get_status::found;
    try {
      check_payload(id, out);
      return get_status::found;
    } catch (const error& e) {
      ++rejected_;
      if (attempt >= options_.check_retries) {
        out.clear();
        throw error(errc::corrupt_payload,
                    "fanout_store: payload " + to_string(id) + " failed its check in " +
                        std::to_string(attempt + 1) + " download(s), not shared: " + e.what());
      }
    }
  }
}

template <payload_store Remote, payload_store Local>
void fanout_store<Remote, Local>::erase_through(std::uint64_t version) {
  remote_->erase_through(version);
  local_->erase_through(version);
  claims_->erase_through(version);
  std::lock_guard lock(mutex_);
  std::erase_if(first_asked_,
                [&](const auto& kv) { return kv.first.attempt.target_version <= version; });
}

template <payload_store Remote, payload_store Local>
fanout_stats fanout_store<Remote, Local>::stats() const {
  return {local_hits_.load(), remote_gets_.load(), remote_bytes_.load(), takeovers_.load(),
          rejected_.load(), fresh_gets_.load()};
}

template <payload_store Remote, payload_store Local>
bool fanout_store<Remote, Local>::overdue(const payload_id& id) const {
  const auto now = protocol_clock::now();
  std::lock_guard lock(mutex_);
  if (first_asked_.size() > 65536) first_asked_.clear();  // bounded; at worst a later takeover
  const auto [it, inserted] = first_asked_.try_emplace(id, now);
  return !inserted && now - it->second >= options_.takeover_after;
}

template <payload_store Remote, payload_store Local>
void fanout_store<Remote, Local>::forget(const payload_id& id) const {
  std::lock_guard lock(mutex_);
  first_asked_.erase(id);
}

}  // namespace dcr

namespace dcr {

inline void check_payload(const payload_id& id, std::span<const std::byte> bytes) {
  std::vector<item_entry> entries;
  const payload_header h = payload_decoder::read_table(bytes, entries);
  DCR_EXPECTS(h.id == id, errc::stale_payload,
              "payload check: the bytes of " + to_string(id) + " are payload " + to_string(h.id));
}

inline directory_claims::directory_claims(std::filesystem::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  DCR_EXPECTS(!ec, errc::transport_failure,
              "directory_claims: cannot create '" + dir_.string() + "': " + ec.message());
}

inline directory_claims::claim directory_claims::try_claim(const payload_id& id) const {
  const auto path = dir_ / to_string(id);
  io::file_descriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  DCR_EXPECTS(fd.valid(), errc::transport_failure,
              "directory_claims: cannot open '" + path.string() + "': " + std::strerror(errno));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return claim(std::move(fd));
  DCR_EXPECTS(errno == EWOULDBLOCK, errc::transport_failure,
              "directory_claims: cannot lock '" + path.string() + "': " + std::strerror(errno));
  return {};
}

inline void directory_claims::erase_through(std::uint64_t version) const {
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir_, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const auto id = parse_payload_id(it->path().filename().string());
    if (id && id->attempt.target_version <= version) std::filesystem::remove(it->path(), ec);
  }
}

}  // namespace dcr
