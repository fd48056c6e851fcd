// dcr/protocol/store/fanout_store.hpp: object-store fan-out inside the rollout cluster (beyond the
// paper), as a pull store for the receivers of one rollout node.
//
// Without fan-out every rollout node downloads every payload from the remote store (S3) across
// the cluster boundary, so the bytes crossing it grow with the number of nodes. With it, each
// payload crosses once: the nodes split the attempt's payloads into disjoint shares, each node
// downloads its share and forwards it into a store local to the rollout cluster (a directory on
// the cluster's shared filesystem, over its local network), and every receiver reads what it
// does not download from there.
//
// fanout_store<Remote, Local>::get(id), on node `node` of `nodes`:
//   1. the local store has it (forwarded by some node): found, nothing crosses;
//   2. else, if the id is in this node's share (share_of) or has been asked for here for at
//      least `takeover_after` without turning up locally (its node is dead, not in this
//      attempt, or busy), this node claims it (directory_claims: one claim per id across the
//      cluster), gets it from the remote store, checks it (fanout_options::check: by default the
//      payload checks the decoder makes before it applies anything, checksum and framing,
//      payload_decoder::read_table, and that the payload is the one asked for), and only then
//      puts it into the local store and answers found. A download that fails the check is
//      downloaded again (check_retries times); one that still fails is shared with nobody:
//      get throws errc::corrupt_payload naming the payload and the failed check;
//   3. else, or while another node holds the claim: absent (a prefetch_source asks again a poll
//      interval later).
// get(id, out, control) with control.fresh (a refetch after a failed apply) skips the local
// copy and the claim: it downloads again and checks, and shares nothing. The control's
// cancellation and deadline reach the remote get when the remote store takes them.
// A claim lasts while its holder downloads and forwards; the kernel drops it when the holder
// dies (flock), so a killed node's share is taken over and no payload waits on a dead node.
// Between live nodes a payload is downloaded once per attempt (a holder that dies mid-download
// is the exception: the next claimer downloads it again). Local copies are written atomically
// (the file store's temp + rename), so a reader never sees a partial forward.
//
// list() is the remote store's; put() and put_manifest() go to the remote store;
// erase_through(v) erases the remote store, the local copies and the claims of transitions
// with target <= v. Thread-safe when both stores are (the prefetch_source's workers call get()
// at once).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dcr/codec/payload.hpp"
#include "dcr/error.hpp"
#include "dcr/io/file.hpp"
#include "dcr/protocol/control_plane.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/payload_store.hpp"

namespace dcr {

/// Exclusive claims on payload ids among processes that share a directory: one file per id,
/// named to_string(id), locked with flock(2) while claimed. A claim is released when its object
/// is destroyed, or by the kernel when its process dies. The directory must be on a filesystem whose flock is
/// coherent across the claimants (a local filesystem; NFSv4 and Lustre with flock enabled).
class directory_claims {
 public:
  /// A held claim (or none: `held()` false). Move-only; releases on destruction (closing the
  /// descriptor drops the lock).
  class claim {
   public:
    claim() = default;
    explicit claim(io::file_descriptor fd) noexcept : fd_(std::move(fd)) {}
    [[nodiscard]] bool held() const noexcept { return fd_.valid(); }

   private:
    io::file_descriptor fd_;
  };

  /// Claims in `dir`, created if needed. Throws errc::transport_failure naming it otherwise.
  explicit directory_claims(std::filesystem::path dir);

  /// Claims `id` if no one holds it; an empty claim if someone does. Throws
  /// errc::transport_failure naming the file if it cannot be opened or locked.
  claim try_claim(const payload_id& id) const;

  /// Removes the claim files of transitions whose target is <= `version`.
  void erase_through(std::uint64_t version) const;

  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

 private:
  std::filesystem::path dir_;
};

/// What a fanout_store checks a download with before it shares it.
enum class fanout_check {
  payload,  ///< check_payload: a dcr payload, intact, with the id it was asked for
  none,     ///< nothing (stores of other bytes than dcr payloads)
};

/// Where one fanout_store sits in the rollout cluster.
struct fanout_options {
  std::uint32_t node = 0;   ///< this rollout node, < nodes
  std::uint32_t nodes = 1;  ///< rollout nodes sharing the work
  /// How long a payload outside this node's share may stay absent locally, counted from the
  /// first get of it here, before this node takes it over.
  std::chrono::milliseconds takeover_after{1000};
  fanout_check check = fanout_check::payload;
  int check_retries = 1;  ///< further downloads of a payload that fails the check, >= 0
};

/// The checks a receiver's decoder makes before anything is applied that need no registry:
/// payload_decoder::read_table (magic, version, sizes, the XXH3-64 checksum, the item table)
/// and the header's attempt, owner and sequence equal to `id`. Throws the decoder's dcr::error
/// (corrupt_payload, truncated_payload, ...) or errc::stale_payload for another id.
void check_payload(const payload_id& id, std::span<const std::byte> bytes);

/// The rollout node (of `nodes`) whose share payload `id` is in: consecutive payloads of an
/// owner go to consecutive nodes, each owner starting elsewhere, so every node's share is
/// within one payload per owner of the others'.
constexpr std::uint32_t share_of(const payload_id& id, std::uint32_t nodes) noexcept {
  const std::uint64_t start = (static_cast<std::uint64_t>(id.owner) * 0x9E3779B97F4A7C15ull) >> 33;
  return nodes == 0 ? 0 : static_cast<std::uint32_t>((start + id.sequence) % nodes);
}

/// What a fanout_store did since construction.
struct fanout_stats {
  std::uint64_t local_hits = 0;    ///< gets answered from the local store
  std::uint64_t remote_gets = 0;   ///< payloads this node downloaded and forwarded
  std::uint64_t remote_bytes = 0;  ///< their bytes
  std::uint64_t takeovers = 0;     ///< of them, outside this node's share
  std::uint64_t rejected = 0;      ///< downloads that failed the check (never shared)
  std::uint64_t fresh_gets = 0;    ///< downloads for get_control::fresh (refetches)
};

template <payload_store Remote, payload_store Local>
class fanout_store {
 public:
  using payload_store_concept = payload_store_tag;

  /// A view for node `options.node`. Throws errc::invalid_argument if node >= nodes.
  fanout_store(Remote& remote, Local& local, directory_claims& claims, fanout_options options);

  void put(const payload_id& id, std::span<const std::byte> bytes) { remote_->put(id, bytes); }
  void put_manifest(const attempt_key& key, std::uint32_t owner, std::span<const payload_id> ids);
  std::vector<owner_listing> list(const attempt_key& key) const { return remote_->list(key); }

  get_status get(const payload_id& id, std::vector<std::byte>& out) const {
    return get(id, out, get_control{});
  }

  /// get with a control (see the file comment: `fresh` downloads again).
  get_status get(const payload_id& id, std::vector<std::byte>& out, const get_control& control) const;

  void erase_through(std::uint64_t version);

  [[nodiscard]] fanout_stats stats() const;

 private:
  // True once `id` was first asked for here at least takeover_after ago.
  bool overdue(const payload_id& id) const;
  void forget(const payload_id& id) const;
  // Downloads `id` and checks it (again on a failed check, check_retries times).
  get_status download(const payload_id& id, std::vector<std::byte>& out, const get_control& control) const;

  Remote* remote_;
  Local* local_;
  directory_claims* claims_;
  fanout_options options_;
  mutable std::mutex mutex_;
  mutable std::map<payload_id, protocol_clock::time_point> first_asked_;
  mutable std::atomic<std::uint64_t> local_hits_{0}, remote_gets_{0}, remote_bytes_{0}, takeovers_{0},
      rejected_{0}, fresh_gets_{0};
};

}  // namespace dcr

#include "dcr/detail/protocol/store/fanout_store.inl"
