// tests/protocol/agents_harness.hpp: a refit deployment in one process made of the real agents,
// each driven by the test directly (not through dcr::in_process_refit), so that a test can kill,
// restart, partition, add and remove any of them at any point of a transition:
//   - a synthetic MoE trainer (dcr::sim::synthetic_trainer) whose owners run owner agents,
//   - serving ranks (dcr::sim::moe_engine_storage + its native loader) running receiver agents
//     over a payload source that can inject delivery faults (dcr::testing::faulty_source),
//   - any number of coordinators,
// all over one control plane (memory or file) seen through three decorators:
//   audited_plane   records every write of the commit record that applied (the commit audit: a
//                   version committed twice, or a commit record rewritten, shows up here)
//   outage_plane    dcr::testing's: a deployment-wide outage (every agent's operations fail)
//   agent_plane     one per agent: a partition (that agent alone is cut off; it retries), a
//                   teardown (every operation fails for good: a dead process writes nothing
//                   more) or a lost reply (a transaction applies, its answer does not arrive)
// and one payload store (memory unless the test hands the cluster another one: an S3 store),
// read by each receiver through a store source (store_source unless told otherwise: a
// prefetch_source). Every agent thread has a deadline; settle() stops what is left of
// a transition and joins every thread (a failing test never leaks a thread), then verify() checks
// what the user relies on: every committed version committed exactly once (audit, history keys,
// commit record), owners' trackers at the version, and every receiver holding it bit-exact with
// a dense refit through its own loader.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/owner_agent.hpp"
#include "dcr/protocol/receiver_agent.hpp"
#include "dcr/sim/moe_engine.hpp"
#include "dcr/sim/moe_model.hpp"
#include "dcr/testing/faults.hpp"

namespace dcr_test {

using namespace std::chrono_literals;
using dcr::protocol_clock;
using dcr::testing::delivery_fault;
using time_point = protocol_clock::time_point;

inline time_point after(protocol_clock::duration d) { return protocol_clock::now() + d; }

inline const char* fault_name(delivery_fault f) {
  switch (f) {
    case delivery_fault::none: return "none";
    case delivery_fault::duplicate: return "duplicate";
    case delivery_fault::corrupt: return "corrupt";
    case delivery_fault::drop: return "drop";
    case delivery_fault::delay: return "delay";
    case delivery_fault::reorder: return "reorder";
    case delivery_fault::stale: return "stale";
    case delivery_fault::lose: return "lose";
  }
  return "?";
}
constexpr std::size_t fault_kinds = 8;

// ---- control-plane decorators

/// Every write of the commit record, as the store applied it.
struct commit_audit {
  std::mutex mutex;
  std::vector<dcr::commit_record> definite;   ///< transactions that applied, in order
  std::vector<dcr::commit_record> uncertain;  ///< transactions that threw (may have applied)
};

template <dcr::control_plane Plane>
class audited_plane {
 public:
  using control_plane_concept = dcr::control_plane_tag;
  audited_plane(Plane& inner, commit_audit& audit, std::string commit_key)
      : inner_(&inner), audit_(&audit), commit_key_(std::move(commit_key)) {}

  std::optional<dcr::control_record> get(const std::string& k) { return inner_->get(k); }
  std::vector<dcr::control_record> list(const std::string& p) { return inner_->list(p); }
  bool transact(std::span<const dcr::key_compare> c, std::span<const dcr::key_write> w) {
    const auto it = std::find_if(w.begin(), w.end(),
                                 [&](const dcr::key_write& x) { return x.key == commit_key_ && !x.erase; });
    if (it == w.end()) return inner_->transact(c, w);
    const auto record = dcr::decode_record<dcr::commit_record>(it->key, it->value);
    // Serialized, so that the audit's order is the store's order.
    std::lock_guard lock(audit_->mutex);
    bool ok = false;
    try {
      ok = inner_->transact(c, w);
    } catch (...) {
      audit_->uncertain.push_back(record);
      throw;
    }
    if (ok) audit_->definite.push_back(record);
    return ok;
  }
  std::int64_t revision() { return inner_->revision(); }
  std::int64_t wait_for_change(const std::string& p, std::int64_t after, time_point d) {
    return inner_->wait_for_change(p, after, d);
  }
  dcr::lease_id grant_lease(std::chrono::seconds ttl) { return inner_->grant_lease(ttl); }
  bool keep_alive(dcr::lease_id l) { return inner_->keep_alive(l); }
  void revoke(dcr::lease_id l) { inner_->revoke(l); }

 private:
  Plane* inner_;
  commit_audit* audit_;
  std::string commit_key_;
};

/// One agent's view of the control plane: partitioned (operations fail as unavailable, so the
/// agent retries until its deadline or the partition ends) or torn down (operations fail with
/// not_ready, which no agent retries: a dead process writes nothing more).
template <dcr::control_plane Plane>
class agent_plane {
 public:
  using control_plane_concept = dcr::control_plane_tag;
  explicit agent_plane(Plane& inner) : inner_(&inner) {}

  void partition(bool on) noexcept { partitioned_ = on; }
  [[nodiscard]] bool partitioned() const noexcept { return partitioned_.load(); }
  void tear_down() noexcept { torn_down_ = true; }
  /// The next transaction that writes `key` runs (applies or fails its compares) and then
  /// throws control_plane_unavailable, as a connection dropped after the store answered would.
  void lose_reply_of_next_write(std::string key) {
    std::lock_guard lock(lose_mutex_);
    lose_key_ = std::move(key);
  }
  [[nodiscard]] int replies_lost() const noexcept { return replies_lost_.load(); }

  std::optional<dcr::control_record> get(const std::string& k) {
    check("get", k);
    return inner_->get(k);
  }
  std::vector<dcr::control_record> list(const std::string& p) {
    check("list", p);
    return inner_->list(p);
  }
  bool transact(std::span<const dcr::key_compare> c, std::span<const dcr::key_write> w) {
    check("transact", w.empty() ? std::string("-") : w.front().key);
    bool lose = false;
    {
      std::lock_guard lock(lose_mutex_);
      if (lose_key_ && std::any_of(w.begin(), w.end(), [&](const dcr::key_write& x) {
            return x.key == *lose_key_ && !x.erase;
          })) {
        lose = true;
        lose_key_.reset();
      }
    }
    const bool ok = inner_->transact(c, w);
    if (lose) {
      ++replies_lost_;
      throw dcr::error(dcr::errc::control_plane_unavailable,
                       std::string("agent_plane: transact '") + w.front().key +
                           "': reply lost (the store answered " + (ok ? "applied" : "compare failed") +
                           ")");
    }
    return ok;
  }
  std::int64_t revision() {
    check("revision", "-");
    return inner_->revision();
  }
  std::int64_t wait_for_change(const std::string& p, std::int64_t after, time_point d) {
    check("wait", p);
    return inner_->wait_for_change(p, after, d);
  }
  dcr::lease_id grant_lease(std::chrono::seconds ttl) {
    check("grant_lease", "-");
    return inner_->grant_lease(ttl);
  }
  bool keep_alive(dcr::lease_id l) {
    check("keep_alive", "-");
    return inner_->keep_alive(l);
  }
  void revoke(dcr::lease_id l) {
    check("revoke", "-");
    inner_->revoke(l);
  }

 private:
  void check(const char* op, const std::string& key) const {
    if (torn_down_)
      throw dcr::error(dcr::errc::not_ready,
                       std::string("agent_plane: ") + op + " '" + key + "': agent torn down");
    if (partitioned_)
      throw dcr::error(dcr::errc::control_plane_unavailable,
                       std::string("agent_plane: ") + op + " '" + key + "': agent partitioned");
  }
  Plane* inner_;
  std::atomic<bool> partitioned_{false}, torn_down_{false};
  std::mutex lose_mutex_;
  std::optional<std::string> lose_key_;
  std::atomic<int> replies_lost_{0};
};

/// A payload source that remembers which payloads of the current attempt it delivered.
template <dcr::payload_source S>
class counting_source {
 public:
  using payload_source_concept = dcr::payload_source_tag;
  explicit counting_source(S& inner) : inner_(&inner) {}
  void open(const dcr::attempt_key& key, std::span<const std::uint32_t> owners) {
    {
      std::lock_guard lock(mutex_);
      key_ = key;
      owners_.assign(owners.begin(), owners.end());
      ids_.clear();
    }
    inner_->open(key, owners);
  }
  dcr::source_status next(dcr::delivery& out, time_point deadline) {
    const auto status = inner_->next(out, deadline);
    if (status == dcr::source_status::delivered) {
      std::lock_guard lock(mutex_);
      if (out.id.attempt == key_) ids_.insert(out.id);
    }
    return status;
  }
  bool refetch(const dcr::payload_id& id, std::vector<std::byte>& bytes) {
    return inner_->refetch(id, bytes);
  }
  [[nodiscard]] dcr::attempt_key key() const {
    std::lock_guard lock(mutex_);
    return key_;
  }
  [[nodiscard]] std::vector<std::uint32_t> owners() const {
    std::lock_guard lock(mutex_);
    return owners_;
  }
  [[nodiscard]] std::size_t distinct_delivered() const {
    std::lock_guard lock(mutex_);
    return ids_.size();
  }

 private:
  S* inner_;
  mutable std::mutex mutex_;
  dcr::attempt_key key_{};
  std::vector<std::uint32_t> owners_;
  std::set<dcr::payload_id> ids_;
};

/// Threads that may start threads; join_all() joins until none is left.
class thread_group {
 public:
  thread_group() = default;
  thread_group(const thread_group&) = delete;
  thread_group& operator=(const thread_group&) = delete;
  ~thread_group() { join_all(); }
  template <class F>
  void spawn(F f) {
    std::lock_guard lock(mutex_);
    threads_.emplace_back([f = std::move(f)]() mutable {
      try {
        f();
      } catch (...) {  // each body records its own outcome
      }
    });
  }
  void join_all() {
    for (;;) {
      std::vector<std::thread> batch;
      {
        std::lock_guard lock(mutex_);
        batch.swap(threads_);
      }
      if (batch.empty()) return;
      for (auto& t : batch) t.join();
    }
  }

 private:
  std::mutex mutex_;
  std::vector<std::thread> threads_;
};

/// What one run_transition call did.
struct run_outcome {
  bool threw = false;
  dcr::errc code = dcr::errc::ok;  ///< when threw a dcr::error
  std::string what;
  dcr::transition_summary summary;
  [[nodiscard]] bool own_commit() const { return !threw && summary.committed && !summary.committed_by_other; }
  [[nodiscard]] std::string describe() const {
    if (threw) return "threw (" + std::to_string(static_cast<int>(code)) + "): " + what;
    return std::string("returned committed=") + (summary.committed ? "1" : "0") +
           " by_other=" + (summary.committed_by_other ? "1" : "0") +
           " attempts=" + std::to_string(summary.attempts.size());
  }
};

struct cluster_options {
  dcr::sim::moe_config model{};
  int trainer_tp = 2, trainer_dp = 2;
  int receivers = 4;                          ///< serving ranks (receiver_tp of the engine)
  std::vector<int> absent_at_start;           ///< ranks that join later (join_receiver)
  std::uint64_t seed = 1;
  dcr::sim::trainer_layout trainer = dcr::sim::trainer_layout::megatron;
  std::vector<dcr::sim::engine_layout> layouts;  ///< per rank; empty: serving
  dcr::apply_path path = dcr::apply_path::compiled;
  bool asynchronous = false;
  bool audit_async_gate = false;  ///< record gate violations (close before every payload, ...)
  std::size_t bucket_bytes = 1536, chunk_bytes = 16384;
  std::size_t owner_build_threads = 1;  ///< owner_agent_options::build_threads
  std::map<int, std::chrono::seconds> receiver_lease;  ///< per rank; default 10 s
  std::chrono::seconds owner_lease{10};
  std::chrono::milliseconds attempt_timeout{30000};
  std::uint32_t max_attempts = 5;
  std::chrono::milliseconds agent_timeout{90000};  ///< every agent thread's serve deadline
};

template <dcr::control_plane Base, dcr::payload_store Store = dcr::memory_payload_store,
          template <class> class StoreSource = dcr::store_source>
class cluster {
 public:
  using audited_t = audited_plane<Base>;
  using global_t = dcr::testing::outage_plane<audited_t>;
  using plane_t = agent_plane<global_t>;
  using store_t = Store;
  using store_source_t = StoreSource<store_t>;
  using faulty_t = dcr::testing::faulty_source<store_source_t>;
  using source_t = counting_source<faulty_t>;
  using receiver_agent_t = dcr::receiver_agent<plane_t, source_t>;
  using owner_agent_t = dcr::owner_agent<plane_t, store_t>;
  using coordinator_t = dcr::coordinator<plane_t, store_t>;
  using engine_receiver = dcr::receiver<dcr::sim::moe_engine_loader>;

  struct rank_state {
    rank_state(const dcr::sim::moe_config& c, int world, int rank, dcr::sim::engine_layout layout,
               const dcr::tensor_registry& registry, dcr::apply_path path, bool prewarm)
        : storage(c, world, rank, layout), loader(storage), rx(registry, loader, dcr::apply_options{path, false}) {
      if (prewarm) rx.prewarm();
    }
    dcr::sim::moe_engine_storage storage;
    dcr::sim::moe_engine_loader loader;
    engine_receiver rx;
  };

  /// One process start of a serving rank's receiver agent.
  struct receiver_inc {
    int rank = 0;
    int generation = 0;
    bool restored_at_start = false;
    std::unique_ptr<rank_state> state;
    std::unique_ptr<plane_t> plane;
    std::unique_ptr<store_source_t> base_source;
    std::unique_ptr<faulty_t> faulty;
    std::unique_ptr<source_t> source;
    std::unique_ptr<receiver_agent_t> agent;
    std::atomic<bool> stop{false}, running{false}, killed{false};
    std::atomic<int> gate_closes{0}, gate_opens{0};
    std::atomic<bool> gate_closed{false};
    std::atomic<std::uint64_t> close_target{0};
    std::string last_error;
  };
  /// One process start of an owner agent.
  struct owner_inc {
    std::size_t slot = 0;
    int generation = 0;
    std::unique_ptr<dcr::owner> owner;
    std::unique_ptr<plane_t> plane;
    std::unique_ptr<owner_agent_t> agent;
    std::atomic<bool> stop{false}, running{false}, killed{false};
    std::string last_error;
  };
  struct coordinator_handle {
    std::unique_ptr<plane_t> plane;
    std::unique_ptr<coordinator_t> coord;
  };

  /// A cluster over its own (default-constructed) payload store.
  cluster(Base& base, cluster_options options)
    requires std::default_initializable<store_t>
      : cluster(base, std::move(options), std::make_unique<store_t>()) {}
  /// A cluster over `store`, which must outlive it.
  cluster(Base& base, cluster_options options, store_t& store)
      : cluster(base, std::move(options), std::unique_ptr<store_t>(), &store) {}

 private:
  cluster(Base& base, cluster_options options, std::unique_ptr<store_t> owned, store_t* external = nullptr)
      : o_(std::move(options)), registry_(o_.model.canonical_tensors()),
        trainer_(o_.model, registry_, o_.trainer_tp, o_.trainer_dp, o_.seed, o_.trainer),
        audited_(base, audit_, keys_.commit()), global_(audited_, outage_), owned_store_(std::move(owned)),
        store_(external != nullptr ? *external : *owned_store_) {
    canonical_.resize(registry_.size());
    for (std::size_t id = 0; id < registry_.size(); ++id) {
      canonical_[id].resize(static_cast<std::size_t>(registry_.at(static_cast<dcr::tensor_id>(id)).bytes()));
      canonical_spans_.emplace_back(canonical_[id]);
    }
    receivers_.resize(static_cast<std::size_t>(o_.receivers));
  }

 public:
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;
  ~cluster() {
    (void)settle({}, 0s);  // stops and joins whatever still runs
  }

  // ---- setup

  /// Owners at version 0, the primary coordinator (commit record at 0), receivers loaded densely
  /// with version 0 (except absent_at_start).
  void start() {
    const auto deadline = after(30s);
    primary_ = &make_coordinator();
    primary_->coord->initialize(0, deadline);
    const auto shard_owner = trainer_.owners();
    const auto residual_owner = trainer_.residual_owners();
    std::map<std::uint32_t, std::size_t> index;
    for (std::size_t i = 0; i < shard_owner.size(); ++i) slot_of(index, shard_owner[i]).shards.push_back(i);
    for (std::size_t r = 0; r < residual_owner.size(); ++r)
      slot_of(index, residual_owner[r]).residual.push_back(r);
    for (auto& s : owners_) {
      for (auto i : s.shards) {
        s.tasks.push_back(trainer_.shards()[i].task);
        s.candidates.push_back(trainer_.words(i));  // the trainer's live words
      }
      for (auto r : s.residual) {
        s.residual_tasks.push_back(trainer_.residual()[r].task);
        s.residual_tasks.back().convert =
            [this, convert = s.residual_tasks.back().convert](
                std::size_t output, std::span<const std::span<const std::byte>> inputs,
                std::span<std::byte> destination) {
          if (on_convert) on_convert();
          convert(output, inputs, destination);
        };
        for (std::size_t k = 0; k < trainer_.residual()[r].task.inputs.size(); ++k)
          s.inputs.push_back(trainer_.residual_words(r, k));
      }
      auto o = std::make_unique<dcr::owner>(registry_, s.rank, s.tasks, s.residual_tasks);
      o->initialize(s.candidates, s.inputs);
      start_owner(s, std::move(o), 0, false);
      owner_ids_.push_back(s.rank);
    }
    std::sort(owner_ids_.begin(), owner_ids_.end());
    assemble();
    for (int r = 0; r < o_.receivers; ++r)
      if (std::find(o_.absent_at_start.begin(), o_.absent_at_start.end(), r) == o_.absent_at_start.end())
        start_receiver(r, true, 0);
  }

  /// A coordinator over its own view of the control plane. `options` default to the cluster's.
  coordinator_handle& make_coordinator(std::optional<dcr::coordinator_options> options = std::nullopt) {
    auto h = std::make_unique<coordinator_handle>();
    h->plane = std::make_unique<plane_t>(global_);
    dcr::coordinator_options co = options ? *options : coordinator_defaults();
    if (!co.before_commit)
      co.before_commit = [this, hp = h.get()](const dcr::attempt_record& a) {
        if (before_commit) before_commit(*hp, a);
      };
    std::vector<std::uint32_t> ids = owner_ids_;
    if (ids.empty())  // called from start(): owners are known from the layout
      for (const auto& [rank, unused] : owner_ranks()) ids.push_back(rank);
    h->coord = std::make_unique<coordinator_t>(*h->plane, store_, registry_.fingerprint(), ids, co);
    std::lock_guard lock(mutex_);
    coordinators_.push_back(std::move(h));
    return *coordinators_.back();
  }
  [[nodiscard]] dcr::coordinator_options coordinator_defaults() const {
    dcr::coordinator_options co;
    co.keys = keys_;
    co.max_attempts = o_.max_attempts;
    co.attempt_timeout = o_.attempt_timeout;
    return co;
  }
  coordinator_handle& primary() { return *primary_; }
  void set_primary(coordinator_handle& h) { primary_ = &h; }

  // ---- a transition

  /// Step the trainer (the candidate weights of the next version).
  void advance(double rate) { trainer_.stress_step(rate); }
  [[nodiscard]] std::string candidate() const { return "step " + std::to_string(trainer_.step()); }

  /// Starts every live agent for the transition from the committed version to the next.
  void launch() {
    std::lock_guard lock(mutex_);
    target_ = version() + 1;
    running_step_ = true;
    for (auto& s : owners_)
      if (s.live) spawn_owner(*s.live);
    for (auto& s : receivers_)
      if (s.live) spawn_receiver(*s.live);
  }

  /// Runs `h`'s run_transition for the current candidate, catching everything.
  run_outcome run(coordinator_handle& h, time_point deadline) {
    run_outcome out;
    try {
      out.summary = h.coord->run_transition(candidate(), deadline);
    } catch (const dcr::error& e) {
      out.threw = true;
      out.code = e.dcr_code();
      out.what = e.what();
    } catch (const std::exception& e) {
      out.threw = true;
      out.code = dcr::errc::ok;
      out.what = std::string("not a dcr::error: ") + e.what();
    }
    return out;
  }

  /// The receivers the committed refit attempt of `version` required ({} if the attempt record
  /// is not that attempt any more).
  std::optional<std::vector<std::string>> committed_receivers(std::uint64_t version) {
    const auto a = dcr::with_retry("test: read attempt", after(20s), [&] {
      return dcr::read_record<dcr::attempt_record>(audited_, keys_.attempt());
    });
    if (!a || a->value.state != dcr::attempt_state::committed || a->value.kind != dcr::attempt_kind::refit ||
        a->value.key.target_version != version)
      return std::nullopt;
    return a->value.receivers;
  }

  /// Ends the transition: waits (up to `grace`) until every live owner and every receiver named
  /// in `required` finished by itself (they do after a commit), stops the rest, ends outages and
  /// joins every thread. Returns "" or what went wrong. Never hangs: an agent still running
  /// after its stop and a teardown aborts the program with a message.
  std::string settle(const std::vector<std::string>& required, protocol_clock::duration grace = 20s) {
    std::string problems;
    const auto deadline = after(grace);
    auto finished = [&] {
      std::lock_guard lock(mutex_);
      for (auto& s : owners_)
        if (s.live && s.live->running) return false;
      for (auto& s : receivers_)
        if (s.live && s.live->running &&
            std::find(required.begin(), required.end(), name(s.live->rank)) != required.end())
          return false;
      return true;
    };
    while (!finished() && protocol_clock::now() < deadline) std::this_thread::sleep_for(2ms);
    if (!finished()) {
      std::lock_guard lock(mutex_);
      for (auto& s : owners_)
        if (s.live && s.live->running) problems += "owner " + std::to_string(s.rank) + " did not finish; ";
      for (auto& s : receivers_)
        if (s.live && s.live->running &&
            std::find(required.begin(), required.end(), name(s.live->rank)) != required.end())
          problems += name(s.live->rank) + " did not finish; ";
    }
    stop_everything();
    if (!wait_quiet(15s)) {
      tear_down_everything();
      if (!wait_quiet(15s)) {
        std::fprintf(stderr, "agents_test: agent threads still running after stop and teardown\n");
        std::abort();
      }
      problems += "agents needed a teardown to stop; ";
    }
    threads_.join_all();
    std::lock_guard lock(mutex_);
    running_step_ = false;
    for (auto& s : owners_)
      if (s.live) s.live->stop = false;
    for (auto& s : receivers_)
      if (s.live) s.live->stop = false;
    for (auto& c : coordinators_) c->plane->partition(false);
    outage_.end();
    return problems;
  }

  /// After the commit of `version`: "" if every version 0..version was committed exactly once
  /// (audit, history keys, commit record), every live owner tracks it, and every live receiver
  /// that holds it (with every name in `required` among them) is bit-exact with a dense refit.
  std::string verify(std::uint64_t version, const std::vector<std::string>& required) {
    std::string p = verify_commits(version);
    std::lock_guard lock(mutex_);
    for (auto& s : owners_)
      if (!s.live)
        p += "owner " + std::to_string(s.rank) + " has no live incarnation; ";
      else if (s.live->agent->tracker_version() != version)
        p += "owner " + std::to_string(s.rank) + " tracks " + std::to_string(s.live->agent->tracker_version()) + "; ";
    assemble();
    last_verified = 0;
    std::set<std::string> holding;
    for (std::size_t r = 0; r < receivers_.size(); ++r) {
      auto* inc = receivers_[r].live.get();
      if (inc == nullptr || inc->killed) continue;
      const bool restored = inc->restored_at_start || inc->agent->restores() > 0;
      if (!restored || inc->agent->committed_version() != version) continue;
      holding.insert(name(static_cast<int>(r)));
      auto& ref = receivers_[r].reference;
      if (!ref)
        ref = std::make_unique<rank_state>(o_.model, o_.receivers, static_cast<int>(r), layout(static_cast<int>(r)),
                                           registry_, o_.path, false);
      ref->storage.reset();
      dense_load_all(ref->rx);
      const auto diff = inc->state->storage.first_difference(ref->storage);
      if (!diff.empty()) p += name(static_cast<int>(r)) + " differs from a dense refit in " + diff + "; ";
      ++verified_receivers_;
      ++last_verified;
    }
    for (const auto& n : required)
      if (!holding.contains(n)) p += n + " was required by the commit but does not hold version " + std::to_string(version) + "; ";
    return p;
  }

  /// The versions committed so far, each exactly once: the audit of commit-record writes is
  /// 0, 1, ..., version; history/k exists for k = 1..version and equals the audited write; the
  /// commit record equals history/version.
  std::string verify_commits(std::uint64_t version) {
    std::string p;
    std::vector<dcr::commit_record> definite, uncertain;
    {
      std::lock_guard lock(audit_.mutex);
      definite = audit_.definite;
      uncertain = audit_.uncertain;
    }
    std::map<std::uint64_t, std::vector<dcr::commit_record>> by_version;
    for (const auto& c : definite) by_version[c.version].push_back(c);
    for (std::size_t k = 1; k < definite.size(); ++k)
      if (definite[k].version != definite[k - 1].version + 1)
        p += "commit record went from version " + std::to_string(definite[k - 1].version) + " to " +
             std::to_string(definite[k].version) + "; ";
    for (const auto& [v, list] : by_version) {
      if (list.size() > 1) p += "version " + std::to_string(v) + " committed " + std::to_string(list.size()) + " times; ";
      if (v > version) p += "version " + std::to_string(v) + " committed beyond " + std::to_string(version) + "; ";
    }
    for (std::uint64_t v = 0; v <= version; ++v)
      if (!by_version.contains(v) &&
          std::none_of(uncertain.begin(), uncertain.end(), [&](const auto& c) { return c.version == v; }))
        p += "no commit of version " + std::to_string(v) + " was seen; ";
    const auto history = dcr::with_retry("test: history", after(20s), [&] {
      return dcr::read_records<dcr::commit_record>(audited_, keys_.history_prefix());
    });
    if (history.size() != version)
      p += std::to_string(history.size()) + " history records for " + std::to_string(version) + " versions; ";
    std::set<std::uint64_t> seen;
    for (const auto& h : history) {
      if (!seen.insert(h.version).second) p += "two history records of version " + std::to_string(h.version) + "; ";
      if (h.candidate != "step " + std::to_string(h.version))
        p += "version " + std::to_string(h.version) + " binds '" + h.candidate + "'; ";
      auto it = by_version.find(h.version);
      if (it != by_version.end() && !(it->second.front() == h))
        p += "history of version " + std::to_string(h.version) + " (attempt " + std::to_string(h.attempt) +
             ") differs from its commit (attempt " + std::to_string(it->second.front().attempt) + "); ";
    }
    const auto commit = dcr::with_retry("test: commit", after(20s), [&] {
      return dcr::read_record<dcr::commit_record>(audited_, keys_.commit());
    });
    if (!commit || commit->value.version != version)
      p += "commit record is not at version " + std::to_string(version) + "; ";
    else if (version > 0) {
      const auto last = std::find_if(history.begin(), history.end(),
                                     [&](const dcr::commit_record& h) { return h.version == version; });
      if (last == history.end() || !(*last == commit->value))
        p += "commit record differs from history/" + std::to_string(version) + "; ";
    }
    return p;
  }

  // ---- faults

  /// Kills a receiver incarnation (its plane torn down: it writes nothing more; its lease
  /// revoked, as its expiry would); `restart` starts a new one at once (empty storage, restored
  /// through the protocol). False if `inc` is not the rank's live incarnation.
  bool kill_receiver(receiver_inc* inc, bool restart) {
    std::lock_guard lock(mutex_);
    auto& slot = receivers_.at(static_cast<std::size_t>(inc->rank));
    if (slot.live.get() != inc) return false;
    inc->killed = true;
    inc->stop = true;
    inc->plane->tear_down();
    revoke_registration(keys_.receiver(name(inc->rank)));
    slot.dead.push_back(std::move(slot.live));
    ++receiver_kills;
    if (restart) start_receiver(inc->rank, false, version());
    return true;
  }
  bool kill_receiver_rank(int rank, bool restart) {
    receiver_inc* inc = live_receiver(rank);
    return inc != nullptr && kill_receiver(inc, restart);
  }
  /// A new incarnation of an absent rank: empty storage, restored through the protocol.
  void join_receiver(int rank) {
    std::lock_guard lock(mutex_);
    if (receivers_.at(static_cast<std::size_t>(rank)).live) return;
    start_receiver(rank, false, version());
  }
  /// Kills an owner incarnation; `restart` starts a new one at once, its trackers regenerated at
  /// the committed version (as a trainer rank reloads its checkpoint).
  bool kill_owner(owner_inc* inc, bool restart) {
    std::lock_guard lock(mutex_);
    auto& slot = owners_.at(inc->slot);
    if (slot.live.get() != inc) return false;
    inc->killed = true;
    inc->stop = true;
    inc->plane->tear_down();
    revoke_registration(keys_.owner(slot.rank));
    slot.dead.push_back(std::move(slot.live));
    ++owner_kills;
    if (restart) restart_owner(inc->slot);
    return true;
  }
  void restart_owner(std::size_t k) {
    std::lock_guard lock(mutex_);
    auto& s = owners_.at(k);
    if (s.live) return;
    const std::uint64_t v = version();
    const auto schedule = trainer_.schedule();
    std::vector<std::vector<std::byte>> words;
    std::vector<std::span<const std::byte>> committed, inputs;
    words.reserve(s.shards.size() + s.inputs.size());
    for (auto i : s.shards) {
      words.emplace_back(trainer_.words(i).size());
      trainer_.shard_words_at(i, v, schedule, words.back());
      committed.push_back(words.back());
    }
    for (auto r : s.residual)
      for (std::size_t in = 0; in < trainer_.residual()[r].task.inputs.size(); ++in) {
        words.emplace_back(trainer_.residual_words(r, in).size());
        trainer_.residual_words_at(r, in, v, schedule, words.back());
        inputs.push_back(words.back());
      }
    auto o = std::make_unique<dcr::owner>(registry_, s.rank, s.tasks, s.residual_tasks);
    o->initialize(committed, inputs);
    start_owner(s, std::move(o), v, true);
  }

  receiver_inc* live_receiver(int rank) {
    std::lock_guard lock(mutex_);
    return receivers_.at(static_cast<std::size_t>(rank)).live.get();
  }
  owner_inc* live_owner(std::size_t k) {
    std::lock_guard lock(mutex_);
    return owners_.at(k).live.get();
  }
  [[nodiscard]] std::size_t owner_count() const { return owners_.size(); }
  [[nodiscard]] int receiver_ranks() const { return o_.receivers; }
  [[nodiscard]] static std::string name(int rank) {
    std::string n = std::to_string(rank);
    n.insert(n.begin(), 'r');
    return n;
  }

  /// Waits until rank `rank`'s registration is present (a re-registration after a partition).
  bool wait_registered(int rank, time_point deadline) {
    while (protocol_clock::now() < deadline) {
      try {
        if (audited_.get(keys_.receiver(name(rank)))) return true;
      } catch (const dcr::error&) {
      }
      std::this_thread::sleep_for(2ms);
    }
    return false;
  }

  /// The committed version (read below every decorator).
  std::uint64_t version() {
    const auto c = dcr::with_retry("test: read commit", after(30s), [&] {
      return dcr::read_record<dcr::commit_record>(audited_, keys_.commit());
    });
    return c ? c->value.version : 0;
  }

  /// Spawns `f` among the cluster's threads (joined by settle()).
  template <class F>
  void spawn(F f) {
    threads_.spawn(std::move(f));
  }

  // ---- hooks, set between transitions (agent threads call them)

  std::function<delivery_fault(int rank, const dcr::attempt_key&, std::uint64_t ordinal)> faults;
  std::function<void(receiver_inc&, const dcr::attempt_record&, std::uint64_t applied)> on_apply;
  std::function<void(owner_inc&, const dcr::attempt_record&, std::uint64_t put)> on_put;
  std::function<void(coordinator_handle&, const dcr::attempt_record&)> before_commit;
  /// Before every residual conversion of every owner (on whichever thread builds it).
  std::function<void()> on_convert;

  // ---- what happened

  std::array<std::atomic<std::uint64_t>, fault_kinds> injected{};
  std::atomic<std::uint64_t> receiver_kills{0}, owner_kills{0};
  std::uint64_t verified_receivers_ = 0;
  std::size_t last_verified = 0;  ///< receivers the last verify() compared
  std::vector<std::string> gate_violations() {
    std::lock_guard lock(violations_mutex_);
    return violations_;
  }

  [[nodiscard]] const dcr::protocol_keys& keys() const { return keys_; }
  audited_t& audited() { return audited_; }
  dcr::testing::control_plane_outage& outage() { return outage_; }
  store_t& store() { return store_; }
  dcr::sim::synthetic_trainer& trainer() { return trainer_; }
  [[nodiscard]] std::uint64_t target() const { return target_; }

 private:
  struct owner_slot {
    std::uint32_t rank = 0;
    std::vector<std::size_t> shards, residual;
    std::vector<dcr::affine_task> tasks;
    std::vector<dcr::residual_task> residual_tasks;
    std::vector<std::span<const std::byte>> candidates, inputs;
    std::unique_ptr<owner_inc> live;
    std::vector<std::unique_ptr<owner_inc>> dead;
  };
  struct receiver_slot {
    std::unique_ptr<receiver_inc> live;
    std::vector<std::unique_ptr<receiver_inc>> dead;
    std::unique_ptr<rank_state> reference;
    int generations = 0;
  };

  std::map<std::uint32_t, int> owner_ranks() const {
    std::map<std::uint32_t, int> out;
    for (auto o : trainer_.owners()) out[o] = 0;
    for (auto o : trainer_.residual_owners()) out[o] = 0;
    return out;
  }

  owner_slot& slot_of(std::map<std::uint32_t, std::size_t>& index, std::uint32_t rank) {
    auto it = index.find(rank);
    if (it == index.end()) {
      it = index.emplace(rank, owners_.size()).first;
      owners_.emplace_back();
      owners_.back().rank = rank;
    }
    return owners_[it->second];
  }

  dcr::sim::engine_layout layout(int rank) const {
    return o_.layouts.empty() ? dcr::sim::engine_layout::serving : o_.layouts.at(static_cast<std::size_t>(rank));
  }

  void assemble() { trainer_.assemble_canonical(canonical_spans_); }

  void dense_load_all(engine_receiver& rx) {
    for (std::size_t id = 0; id < registry_.size(); ++id) {
      const auto& t = registry_.at(static_cast<dcr::tensor_id>(id));
      dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        rx.template dense_load<W>(static_cast<dcr::tensor_id>(id),
                                  dcr::tensor_view<const W>::contiguous(
                                      reinterpret_cast<const W*>(canonical_[id].data()), t.shape));
      });
    }
  }

  void record_violation(std::string what) {
    std::lock_guard lock(violations_mutex_);
    violations_.push_back(std::move(what));
  }

  void revoke_registration(const std::string& key) {
    try {
      if (auto r = audited_.get(key); r && r->lease != 0) audited_.revoke(r->lease);
    } catch (const dcr::error&) {  // a file store away: its lease expires instead
    }
  }

  // `restored`: the storage is loaded densely with `v` (the canonical buffers hold v).
  void start_receiver(int rank, bool restored, std::uint64_t v) {
    auto& slot = receivers_.at(static_cast<std::size_t>(rank));
    auto inc = std::make_unique<receiver_inc>();
    receiver_inc* p = inc.get();
    inc->rank = rank;
    inc->generation = slot.generations++;
    inc->restored_at_start = restored;
    inc->state = std::make_unique<rank_state>(o_.model, o_.receivers, rank, layout(rank), registry_, o_.path, true);
    if (restored) dense_load_all(inc->state->rx);
    inc->plane = std::make_unique<plane_t>(global_);
    inc->base_source = std::make_unique<store_source_t>(store_);
    inc->faulty = std::make_unique<faulty_t>(*inc->base_source, [this, rank](const dcr::attempt_key& k, std::uint64_t n) {
      if (!faults) return delivery_fault::none;
      const auto f = faults(rank, k, n);
      if (f != delivery_fault::none) ++injected[static_cast<std::size_t>(f)];
      return f;
    });
    inc->source = std::make_unique<source_t>(*inc->faulty);
    dcr::receiver_agent_options ro;
    ro.keys = keys_;
    ro.asynchronous = o_.asynchronous;
    if (auto it = o_.receiver_lease.find(rank); it != o_.receiver_lease.end()) ro.lease_ttl = it->second;
    ro.after_apply = [this, p](const dcr::attempt_record& a, std::uint64_t n) {
      if (o_.audit_async_gate && a.kind == dcr::attempt_kind::refit && !p->gate_closed)
        record_violation(name(p->rank) + ": applied a payload of " + dcr::to_string(a.key) +
                         " with the gate open");
      if (on_apply) on_apply(*p, a, n);
    };
    dcr::request_gate gate;
    gate.close = [this, p] {
      if (o_.audit_async_gate) {
        const auto key = p->source->key();
        const auto owners = p->source->owners();
        std::size_t listed = 0;
        bool complete = true;
        std::size_t seen = 0;
        for (const auto& l : store_.list(key)) {
          if (std::find(owners.begin(), owners.end(), l.owner) == owners.end()) continue;
          ++seen;
          complete = complete && l.complete;
          listed += l.ids.size();
        }
        complete = complete && seen == owners.size();
        if (!complete || listed != p->source->distinct_delivered())
          record_violation(name(p->rank) + ": gate closed in " + dcr::to_string(key) + " after " +
                           std::to_string(p->source->distinct_delivered()) + " of " + std::to_string(listed) +
                           " payloads (manifests " + (complete ? "complete" : "incomplete") + ")");
        p->close_target = key.target_version;
      }
      if (p->gate_closed) record_violation(name(p->rank) + ": gate closed twice");
      p->gate_closed = true;
      ++p->gate_closes;
    };
    gate.open = [this, p] {
      std::optional<dcr::typed_record<dcr::commit_record>> c;
      try {
        c = dcr::read_record<dcr::commit_record>(audited_, keys_.commit());
      } catch (const dcr::error&) {  // a file store away: not this test's question
      }
      if (o_.audit_async_gate && (!c || c->value.version != p->close_target))
        record_violation(name(p->rank) + ": gate opened before the commit of version " +
                         std::to_string(p->close_target.load()));
      if (!p->gate_closed) record_violation(name(p->rank) + ": gate opened while open");
      p->gate_closed = false;
      ++p->gate_opens;
    };
    inc->agent = std::make_unique<receiver_agent_t>(name(rank), inc->state->rx, registry_.fingerprint(), *inc->plane,
                                                    *inc->source, ro, gate);
    inc->agent->start(v, restored, after(30s));
    slot.live = std::move(inc);
    if (running_step_) spawn_receiver(*p);
  }

  void spawn_receiver(receiver_inc& inc) {
    inc.running = true;
    threads_.spawn([this, p = &inc, target = target_, timeout = o_.agent_timeout] {
      try {
        p->agent->serve_until(target, after(timeout), &p->stop);
      } catch (const std::exception& e) {
        p->last_error = e.what();
      }
      p->running = false;
    });
  }

  void start_owner(owner_slot& s, std::unique_ptr<dcr::owner> o, std::uint64_t v, bool restarted) {
    auto inc = std::make_unique<owner_inc>();
    owner_inc* p = inc.get();
    inc->slot = static_cast<std::size_t>(&s - owners_.data());
    inc->owner = std::move(o);
    inc->plane = std::make_unique<plane_t>(global_);
    dcr::owner_agent_options oo;
    oo.keys = keys_;
    oo.bucket_bytes = o_.bucket_bytes;
    oo.chunk_bytes = o_.chunk_bytes;
    oo.build_threads = o_.owner_build_threads;
    oo.lease_ttl = o_.owner_lease;
    oo.after_put = [this, p](const dcr::attempt_record& a, std::uint64_t n) {
      if (on_put) on_put(*p, a, n);
    };
    inc->agent = std::make_unique<owner_agent_t>(*inc->owner, registry_, *inc->plane, store_, oo);
    inc->agent->start(v, after(30s), restarted);
    s.live = std::move(inc);
    if (running_step_) spawn_owner(*p);
  }

  void spawn_owner(owner_inc& inc) {
    inc.running = true;
    auto& s = owners_.at(inc.slot);
    threads_.spawn([p = &inc, slot = &s, cand = "step " + std::to_string(target_), timeout = o_.agent_timeout] {
      try {
        p->agent->serve_transition(cand, slot->candidates, slot->inputs, after(timeout), &p->stop);
      } catch (const std::exception& e) {
        p->last_error = e.what();
      }
      p->running = false;
    });
  }

  void for_each_plane(const std::function<void(plane_t&)>& f) {
    std::lock_guard lock(mutex_);
    for (auto& s : owners_) {
      if (s.live) f(*s.live->plane);
      for (auto& d : s.dead) f(*d->plane);
    }
    for (auto& s : receivers_) {
      if (s.live) f(*s.live->plane);
      for (auto& d : s.dead) f(*d->plane);
    }
    for (auto& c : coordinators_) f(*c->plane);
  }

  void stop_everything() {
    outage_.end();
    {
      std::lock_guard lock(mutex_);
      for (auto& s : owners_) {
        if (s.live) s.live->stop = true;
        for (auto& d : s.dead) d->stop = true;
      }
      for (auto& s : receivers_) {
        if (s.live) s.live->stop = true;
        for (auto& d : s.dead) d->stop = true;
      }
      // A partitioned live agent (cut off, not dead) comes back, sees its stop flag and ends;
      // dead ones stay torn down.
      for (auto& s : owners_)
        if (s.live) s.live->plane->partition(false);
      for (auto& s : receivers_)
        if (s.live) s.live->plane->partition(false);
      for (auto& c : coordinators_) c->plane->partition(false);
    }
    // Wake every waiter (agents wait at most a second anyway).
    try {
      dcr::put(audited_, keys_.prefix + "/wake", std::to_string(++wakes_));
    } catch (const dcr::error&) {
    }
  }

  void tear_down_everything() {
    for_each_plane([](plane_t& p) { p.tear_down(); });
  }

  bool wait_quiet(protocol_clock::duration limit) {
    const auto deadline = after(limit);
    auto quiet = [&] {
      std::lock_guard lock(mutex_);
      for (auto& s : owners_) {
        if (s.live && s.live->running) return false;
        for (auto& d : s.dead)
          if (d->running) return false;
      }
      for (auto& s : receivers_) {
        if (s.live && s.live->running) return false;
        for (auto& d : s.dead)
          if (d->running) return false;
      }
      return true;
    };
    while (!quiet()) {
      if (protocol_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(2ms);
    }
    return true;
  }

  cluster_options o_;
  dcr::tensor_registry registry_;
  dcr::sim::synthetic_trainer trainer_;
  std::vector<std::vector<std::byte>> canonical_;
  std::vector<std::span<std::byte>> canonical_spans_;
  dcr::protocol_keys keys_{};
  commit_audit audit_;
  audited_t audited_;
  dcr::testing::control_plane_outage outage_;
  global_t global_;
  std::unique_ptr<store_t> owned_store_;
  store_t& store_;
  std::vector<std::uint32_t> owner_ids_;
  std::recursive_mutex mutex_;
  std::vector<owner_slot> owners_;
  std::vector<receiver_slot> receivers_;
  std::vector<std::unique_ptr<coordinator_handle>> coordinators_;
  coordinator_handle* primary_ = nullptr;
  std::uint64_t target_ = 0;
  bool running_step_ = false;
  std::uint64_t wakes_ = 0;
  std::mutex violations_mutex_;
  std::vector<std::string> violations_;
  thread_group threads_;  // last: joined before anything the threads use is destroyed
};

}  // namespace dcr_test
