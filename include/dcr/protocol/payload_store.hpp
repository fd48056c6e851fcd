// dcr/protocol/payload_store.hpp: where owners put payloads and receivers get them (pull
// stores: a directory, S3, memory), and what a receiver agent reads from (a payload source,
// which a push transport such as a relay implements directly and any pull store gets through
// store_source in dcr/protocol/payload_source.hpp). Owners need only the sink half (put,
// put_manifest) and the coordinator only erase_through, so a push transport gives owners a
// payload_sink and the coordinator nothing_to_erase.
//
// Object-storage semantics, per attempt of a transition:
//   - an owner puts each payload once, as soon as it is built (payload ids are immutable
//     names: putting an id again with other bytes is an error);
//   - when it has put its last payload of the attempt, it puts its manifest: the complete list
//     of its payload ids for that attempt;
//   - receivers list the attempt as it fills: per owner, the ids visible so far and whether the
//     owner's manifest is complete (then the list is exactly the manifest), and get what is
//     listed; get answers `absent` (not there, or not yet) rather than failing;
//   - after a commit of version v, erase_through(v) drops every object of transitions whose
//     target is <= v (restores of v included): nothing a receiver can still need.
// The store never interprets payload bytes: integrity is the payload checksum's job, checked by
// the receiver, which fetches a damaged download once more before it gives up.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/error.hpp"
#include "dcr/io/file.hpp"

namespace dcr {

namespace detail {

/// A manifest as stores keep it: "dcr-manifest 1 <count>\n", then one sequence number per
/// line, in the order given.
inline std::string manifest_text(std::span<const payload_id> ids) {
  std::string text = "dcr-manifest 1 " + std::to_string(ids.size()) + "\n";
  for (const auto& id : ids) text += std::to_string(id.sequence) + "\n";
  return text;
}

/// The ids a manifest of `owner` for `key` lists, sorted. Throws errc::transport_failure,
/// prefixed with `where`, for anything but manifest_text's output (a bad header, a count that
/// disagrees with the lines, a line that is not a sequence number).
inline std::vector<payload_id> parse_manifest(std::string_view text, const attempt_key& key,
                                              std::uint32_t owner, const std::string& where) {
  const auto damaged = [&](const std::string& why) -> std::vector<payload_id> {
    throw error(errc::transport_failure, where + " is damaged: " + why);
  };
  constexpr std::string_view magic = "dcr-manifest 1 ";
  const auto first = text.find('\n');
  if (!text.starts_with(magic) || first == std::string_view::npos) return damaged("no header");
  auto number = [](std::string_view digits, std::uint64_t limit) -> std::optional<std::uint64_t> {
    if (digits.empty() || digits.size() > 20) return std::nullopt;
    std::uint64_t v = 0;
    for (const char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      if (v > (limit - static_cast<std::uint64_t>(c - '0')) / 10) return std::nullopt;
      v = v * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return v;
  };
  const auto count = number(text.substr(magic.size(), first - magic.size()), UINT32_MAX);
  if (!count) return damaged("bad count");
  std::vector<payload_id> ids;
  for (std::size_t at = first + 1; at < text.size();) {
    const auto nl = text.find('\n', at);
    if (nl == std::string_view::npos) return damaged("unterminated line");
    const auto seq = number(text.substr(at, nl - at), UINT32_MAX);
    if (!seq) return damaged("bad sequence number '" + std::string(text.substr(at, nl - at)) + "'");
    ids.push_back(payload_id{key, owner,
                             static_cast<std::uint32_t>(*seq)});
    at = nl + 1;
  }
  if (ids.size() != *count)
    return damaged("lists " + std::to_string(ids.size()) + " payloads, its header " +
                   std::to_string(*count));
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace detail

/// Opt-in tags: a payload store declares `using payload_store_concept = dcr::payload_store_tag;`.
/// A sink (what an owner agent needs: put payloads, then the manifest, nothing to read back,
/// e.g. the owner end of a push transport) declares `payload_sink_tag`; every store is a sink.
struct payload_sink_tag {};
struct payload_store_tag : payload_sink_tag {};

/// What one owner has put for one attempt so far.
struct owner_listing {
  std::uint32_t owner = 0;
  std::vector<payload_id> ids;  ///< sorted by sequence
  bool complete = false;        ///< the owner's manifest is in: `ids` is its whole list
};

/// Result of a get.
enum class get_status {
  found,   ///< the bytes are in the output buffer
  absent,  ///< no such object (not put yet, or erased)
};

template <class S>
concept payload_sink =
    std::derived_from<typename S::payload_store_concept, payload_sink_tag> &&
    requires(S& s, const payload_id& id, std::span<const std::byte> bytes, const attempt_key& key,
             std::uint32_t owner, std::span<const payload_id> ids) {
      s.put(id, bytes);                   // once per id (equal bytes again: no-op)
      s.put_manifest(key, owner, ids);    // the owner's complete list for the attempt
    };

/// A sink that routes by attempt (a push transport) is told each attempt, the receivers it
/// requires and its deadline (the coordinator fails the attempt then: no wait of the sink for
/// that attempt need last longer) before the owner's first put of it; the owner agent calls
/// open_attempt when the sink has it.
template <class S>
concept attempt_routed_sink =
    payload_sink<S> && requires(S& s, const attempt_key& key, std::span<const std::string> receivers,
                                std::chrono::steady_clock::time_point deadline) {
      s.open_attempt(key, receivers, deadline);
    };

/// What the coordinator needs after a commit: drop what it made obsolete.
template <class S>
concept payload_cleanup = requires(S& s, std::uint64_t version) {
  s.erase_through(version);  // objects of transitions with target <= version
};

template <class S>
concept payload_store =
    payload_sink<S> && payload_cleanup<S> &&
    std::derived_from<typename S::payload_store_concept, payload_store_tag> &&
    requires(S& s, const payload_id& id, const attempt_key& key, std::vector<std::byte>& out) {
      { s.list(key) } -> std::same_as<std::vector<owner_listing>>;  // by owner ascending
      { s.get(id, out) } -> std::same_as<get_status>;
    };

/// The coordinator's cleanup for a transport that stores nothing a commit makes obsolete (the
/// relay: its nodes drop an attempt's payloads as soon as a later attempt is announced).
struct nothing_to_erase {
  void erase_through(std::uint64_t) noexcept {}
};

/// An in-memory payload store (tests, the in-process driver). Thread-safe.
class memory_payload_store {
 public:
  using payload_store_concept = payload_store_tag;

  void put(const payload_id& id, std::span<const std::byte> bytes) {
    std::lock_guard lock(mutex_);
    auto [it, inserted] = objects_.try_emplace(id, bytes.begin(), bytes.end());
    DCR_EXPECTS(inserted || std::equal(bytes.begin(), bytes.end(), it->second.begin(),
                                       it->second.end()),
                errc::transport_failure,
                "memory_payload_store: payload (owner " + std::to_string(id.owner) +
                    ", sequence " + std::to_string(id.sequence) + ") put again with other bytes");
    if (inserted) bytes_put_ += bytes.size();
  }

  void put_manifest(const attempt_key& key, std::uint32_t owner,
                    std::span<const payload_id> ids) {
    std::lock_guard lock(mutex_);
    for (const auto& id : ids)
      DCR_EXPECTS(objects_.contains(id) && id.attempt == key && id.owner == owner,
                  errc::transport_failure,
                  "memory_payload_store: manifest of owner " + std::to_string(owner) +
                      " lists a payload that was not put for its attempt");
    manifests_[key][owner] = std::vector<payload_id>(ids.begin(), ids.end());
  }

  std::vector<owner_listing> list(const attempt_key& key) const {
    std::lock_guard lock(mutex_);
    std::map<std::uint32_t, owner_listing> by_owner;
    for (auto it = objects_.lower_bound(payload_id{key, 0, 0});
         it != objects_.end() && it->first.attempt == key; ++it) {
      auto& l = by_owner[it->first.owner];
      l.owner = it->first.owner;
      l.ids.push_back(it->first);
    }
    if (auto m = manifests_.find(key); m != manifests_.end())
      for (const auto& [owner, ids] : m->second) by_owner[owner] = {owner, ids, true};
    std::vector<owner_listing> out;
    for (auto& [owner, l] : by_owner) out.push_back(std::move(l));
    return out;
  }

  get_status get(const payload_id& id, std::vector<std::byte>& out) const {
    std::lock_guard lock(mutex_);
    auto it = objects_.find(id);
    if (it == objects_.end()) return get_status::absent;
    out.assign(it->second.begin(), it->second.end());
    return get_status::found;
  }

  void erase_through(std::uint64_t version) {
    std::lock_guard lock(mutex_);
    std::erase_if(objects_, [&](const auto& kv) { return kv.first.attempt.target_version <= version; });
    std::erase_if(manifests_, [&](const auto& kv) { return kv.first.target_version <= version; });
  }

  /// Unique payload bytes put since construction.
  std::uint64_t bytes_put() const {
    std::lock_guard lock(mutex_);
    return bytes_put_;
  }
  /// Objects currently stored.
  std::size_t object_count() const {
    std::lock_guard lock(mutex_);
    return objects_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::map<payload_id, std::vector<std::byte>> objects_;
  std::map<attempt_key, std::map<std::uint32_t, std::vector<payload_id>>> manifests_;
  std::uint64_t bytes_put_ = 0;
};

static_assert(payload_store<memory_payload_store>);

/// A payload store in a directory on a local or shared filesystem (the embedded default).
/// Layout: DIR/<attempt>/o<owner>/p<sequence> for payloads and DIR/<attempt>/o<owner>/manifest,
/// where <attempt> is to_string(attempt_key), "t<base>-<target>-a<number>". Every file is
/// written as a hidden temporary in its final directory, fsynced and renamed (never torn;
/// readers skip temporaries), so it is safe for concurrent processes and on NFS-like mounts
/// (rename within a directory is atomic there too). Every filesystem failure throws
/// errc::transport_failure naming the path.
class file_payload_store {
 public:
  using payload_store_concept = payload_store_tag;

  /// Uses `dir`, creating it if needed.
  explicit file_payload_store(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    DCR_EXPECTS(!ec, errc::transport_failure,
                "file_payload_store: cannot create '" + dir_.string() + "': " + ec.message());
  }

  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

  void put(const payload_id& id, std::span<const std::byte> bytes) {
    const auto path = payload_path(id);
    guarded(path, [&] {
      std::filesystem::create_directories(path.parent_path());
      if (io::path_exists(path)) {
        std::vector<std::byte> have;
        read_file(path, have);
        DCR_EXPECTS(std::equal(bytes.begin(), bytes.end(), have.begin(), have.end()),
                    errc::transport_failure,
                    "file_payload_store: '" + path.string() + "' put again with other bytes");
        return;
      }
      io::atomic_file f(path);
      f.write_at(bytes, 0);
      f.commit();
    });
  }

  void put_manifest(const attempt_key& key, std::uint32_t owner,
                    std::span<const payload_id> ids) {
    const auto path = attempt_dir(key) / ("o" + std::to_string(owner)) / "manifest";
    guarded(path, [&] {
      for (const auto& id : ids)
        DCR_EXPECTS(id.attempt == key && id.owner == owner && io::path_exists(payload_path(id)),
                    errc::transport_failure,
                    "file_payload_store: manifest '" + path.string() +
                        "' lists a payload that was not put for its attempt");
      const std::string text = detail::manifest_text(ids);
      std::filesystem::create_directories(path.parent_path());
      io::atomic_file f(path);
      f.write_at(std::as_bytes(std::span(text)), 0);
      f.commit();
    });
  }

  std::vector<owner_listing> list(const attempt_key& key) const {
    const auto dir = attempt_dir(key);
    std::vector<owner_listing> out;
    guarded(dir, [&] {
      std::error_code ec;
      if (!std::filesystem::is_directory(dir, ec)) return;
      for (const auto& o : std::filesystem::directory_iterator(dir)) {
        const auto name = o.path().filename().string();
        if (name.size() < 2 || name[0] != 'o') continue;
        owner_listing l;
        l.owner = static_cast<std::uint32_t>(std::stoul(name.substr(1)));
        const auto manifest = o.path() / "manifest";
        if (io::path_exists(manifest)) {
          std::vector<std::byte> raw;
          read_file(manifest, raw);
          l.ids = detail::parse_manifest(
              std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()), key, l.owner,
              "file_payload_store: manifest '" + manifest.string() + "'");
          l.complete = true;
        } else {
          for (const auto& p : std::filesystem::directory_iterator(o.path())) {
            const auto pn = p.path().filename().string();
            if (pn.size() < 2 || pn[0] != 'p') continue;  // temporaries start with '.'
            l.ids.push_back(payload_id{key, l.owner,
                                       static_cast<std::uint32_t>(std::stoul(pn.substr(1)))});
          }
        }
        std::sort(l.ids.begin(), l.ids.end());
        out.push_back(std::move(l));
      }
    });
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.owner < b.owner; });
    return out;
  }

  get_status get(const payload_id& id, std::vector<std::byte>& out) const {
    const auto path = payload_path(id);
    get_status status = get_status::absent;
    guarded(path, [&] {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT) return;  // not put yet, or erased
      if (fd < 0) io::throw_io_error("cannot open", path, errno);
      read_all(io::file_descriptor(fd), path, out);
      status = get_status::found;
    });
    return status;
  }

  void erase_through(std::uint64_t version) {
    guarded(dir_, [&] {
      for (const auto& t : std::filesystem::directory_iterator(dir_)) {
        const auto key = parse_attempt_key(t.path().filename().string());
        if (key && key->target_version <= version) std::filesystem::remove_all(t.path());
      }
    });
  }

 private:
  [[nodiscard]] std::filesystem::path attempt_dir(const attempt_key& key) const {
    return dir_ / to_string(key);
  }
  [[nodiscard]] std::filesystem::path payload_path(const payload_id& id) const {
    return attempt_dir(id.attempt) / ("o" + std::to_string(id.owner)) /
           ("p" + std::to_string(id.sequence));
  }

  static void read_all(const io::file_descriptor& fd, const std::filesystem::path& path,
                       std::vector<std::byte>& out) {
    out.resize(static_cast<std::size_t>(io::file_size(fd.get(), path)));
    std::size_t done = 0;
    while (done < out.size()) {
      const auto n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) io::throw_io_error("cannot read", path, n < 0 ? errno : EIO);
      done += static_cast<std::size_t>(n);
    }
  }
  static void read_file(const std::filesystem::path& path, std::vector<std::byte>& out) {
    read_all(io::file_descriptor::open(path, O_RDONLY), path, out);
  }

  template <class F>
  static void guarded(const std::filesystem::path& path, F&& f) {
    try {
      f();
    } catch (const error& e) {
      if (e.dcr_code() == errc::io_error)
        throw error(errc::transport_failure, std::string("file_payload_store: ") + e.what());
      throw;
    } catch (const std::filesystem::filesystem_error& e) {
      throw error(errc::transport_failure,
                  "file_payload_store: '" + path.string() + "': " + e.code().message());
    } catch (const std::invalid_argument&) {
      throw error(errc::transport_failure,
                  "file_payload_store: unexpected file name under '" + path.string() + "'");
    }
  }

  std::filesystem::path dir_;
};

static_assert(payload_store<file_payload_store>);

}  // namespace dcr
