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
//     of its payload ids for that attempt (the stores here record each payload's size with it);
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

/// What one owner has put for one attempt so far.
struct owner_listing {
  std::uint32_t owner = 0;
  std::vector<payload_id> ids;  ///< sorted by sequence
  bool complete = false;        ///< the owner's manifest is in: `ids` is its whole list
  /// Empty, or (a complete listing whose manifest records sizes) sizes[i] is the byte count
  /// of ids[i]: the payload sources take it as the exact size of what they get, so that a
  /// body that is longer is refused at its first bytes past it and one of another length is
  /// never handed to the receiver.
  std::vector<std::uint64_t> sizes;
};

namespace detail {

/// A manifest as stores keep it: "dcr-manifest 2 <count>\n", then one line
/// "<sequence> <bytes>\n" per payload, in the order given (sizes[i] belongs to ids[i]; both
/// spans have the same length).
std::string manifest_text(std::span<const payload_id> ids, std::span<const std::uint64_t> sizes);

/// The listing a manifest of `owner` for `key` gives: complete, ids sorted with their sizes.
/// Reads manifest_text's output and the earlier format without sizes ("dcr-manifest 1
/// <count>\n", one sequence number per line; `sizes` stays empty). Throws
/// errc::transport_failure, prefixed with `where`, for anything else (a bad header, a count
/// that disagrees with the lines, a line that is not a sequence number and a size of at least
/// one byte, a sequence listed twice).
owner_listing parse_manifest(std::string_view text, const attempt_key& key, std::uint32_t owner,
                             const std::string& where);

}  // namespace detail

/// Opt-in tags: a payload store declares `using payload_store_concept = dcr::payload_store_tag;`.
/// A sink (what an owner agent needs: put payloads, then the manifest, nothing to read back,
/// e.g. the owner end of a push transport) declares `payload_sink_tag`; every store is a sink.
struct payload_sink_tag {};
struct payload_store_tag : payload_sink_tag {};

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

  void put(const payload_id& id, std::span<const std::byte> bytes);

  void put_manifest(const attempt_key& key, std::uint32_t owner,
                    std::span<const payload_id> ids);

  std::vector<owner_listing> list(const attempt_key& key) const;

  get_status get(const payload_id& id, std::vector<std::byte>& out) const;

  void erase_through(std::uint64_t version);

  /// Unique payload bytes put since construction.
  std::uint64_t bytes_put() const;
  /// Objects currently stored.
  std::size_t object_count() const;

 private:
  mutable std::mutex mutex_;
  std::map<payload_id, std::vector<std::byte>> objects_;
  std::map<attempt_key, std::map<std::uint32_t, owner_listing>> manifests_;
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
  explicit file_payload_store(std::filesystem::path dir);

  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

  void put(const payload_id& id, std::span<const std::byte> bytes);

  void put_manifest(const attempt_key& key, std::uint32_t owner,
                    std::span<const payload_id> ids);

  std::vector<owner_listing> list(const attempt_key& key) const;

  get_status get(const payload_id& id, std::vector<std::byte>& out) const;

  void erase_through(std::uint64_t version);

 private:
  [[nodiscard]] std::filesystem::path attempt_dir(const attempt_key& key) const;
  [[nodiscard]] std::filesystem::path payload_path(const payload_id& id) const;

  static void read_all(const io::file_descriptor& fd, const std::filesystem::path& path,
                       std::vector<std::byte>& out);
  static void read_file(const std::filesystem::path& path, std::vector<std::byte>& out);

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

#include "dcr/detail/protocol/payload_store.inl"
