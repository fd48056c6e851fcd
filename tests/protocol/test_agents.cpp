// tests/protocol/test_agents.cpp: rows of the protocol's fault matrix (docs/protocol.md) run in
// one process with the real agents (agents_harness.hpp): racing and replaced coordinators,
// receivers joining and leaving between attempts, two receivers killed in one attempt, the
// asynchronous request gate, the file control plane going away mid-transition, and a randomized
// soak of all of it. After every committed step: every version was committed exactly once (the
// audit of commit-record writes, the history keys, the commit record) and every receiver holding
// it is bit-exact with a dense refit through its own loader.
//
// The soak's size: DCR_SOAK_SEEDS (default 8) x DCR_SOAK_TRANSITIONS (default 25); with
// DCR_SOAK_SECONDS it runs seed after seed until that many seconds have passed. It prints one
// summary line ("agents soak: ...").
#include <doctest/doctest.h>

#include <condition_variable>
#include <filesystem>
#include <latch>
#include <optional>

#include "agents_harness.hpp"
#include "dcr/protocol/plane/file_control_plane.hpp"
#include "dcr/protocol/plane/memory_control_plane.hpp"
#include "dcr/sim/random.hpp"

namespace {

using namespace dcr_test;
using memory_cluster = cluster<dcr::memory_control_plane>;
using file_cluster = cluster<dcr::file_control_plane>;

bool is_restore(const dcr::attempt_key& k) { return k.base_version == k.target_version; }

template <class C>
run_outcome simple_step(C& c, double rate, protocol_clock::duration timeout = 60s) {
  c.advance(rate);
  c.launch();
  return c.run(c.primary(), after(timeout));
}

/// The receivers the committed refit attempt of the summary acknowledged `applied`.
std::vector<std::string> applied_in_commit(const dcr::transition_summary& s) {
  std::vector<std::string> out;
  for (auto it = s.attempts.rbegin(); it != s.attempts.rend(); ++it) {
    if (it->kind != dcr::attempt_kind::refit || !it->committed) continue;
    for (const auto& a : it->acks)
      if (a.state == dcr::ack_state::applied) out.push_back(a.name);
    break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Settles a transition that committed version `v` and verifies it; returns the receivers the
/// commit required.
template <class C>
std::vector<std::string> settle_and_verify(C& c, std::uint64_t v) {
  const auto required = c.committed_receivers(v);
  REQUIRE_MESSAGE(required.has_value(), "the attempt record is not the committed attempt of version " << v);
  CHECK(c.settle(*required) == "");
  CHECK(c.verify(v, *required) == "");
  return *required;
}

template <class C>
dcr::commit_record commit_now(C& c) {
  const auto r = dcr::read_record<dcr::commit_record>(c.audited(), c.keys().commit());
  REQUIRE(r.has_value());
  return r->value;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/dcr-agents-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// The file control plane's directory moved aside and back (what `dcr simulate --commit-outage`
/// does to the file store): every operation of every agent fails as unavailable meanwhile.
struct directory_outage {
  directory_outage(std::filesystem::path d, std::filesystem::path a) : dir(std::move(d)), away(std::move(a)) {}
  std::filesystem::path dir, away;
  std::mutex mutex;
  bool out = false;
  int count = 0;
  void begin() {
    std::lock_guard lock(mutex);
    if (out) return;
    std::filesystem::rename(dir, away);
    out = true;
    ++count;
  }
  void end() {
    std::lock_guard lock(mutex);
    if (!out) return;
    std::filesystem::rename(away, dir);
    out = false;
  }
  bool active() {
    std::lock_guard lock(mutex);
    return out;
  }
  ~directory_outage() {
    try {
      end();
    } catch (...) {
    }
  }
};

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  return std::strtoull(s, nullptr, 10);
}

}  // namespace

// ---- the fault injector itself

TEST_CASE("faulty_source: any pattern of reorders delivers every payload exactly once") {
  // A source of six payloads; every subset of deliveries is reordered (consecutive reorders
  // once lost the payload held back first: the soak found a commit missing it).
  struct list_source {
    using payload_source_concept = dcr::payload_source_tag;
    std::vector<dcr::delivery> items;
    std::size_t at = 0;
    void open(const dcr::attempt_key&, std::span<const std::uint32_t>) { at = 0; }
    dcr::source_status next(dcr::delivery& out, time_point) {
      if (at == items.size()) return dcr::source_status::complete;
      out = items[at++];
      return dcr::source_status::delivered;
    }
    bool refetch(const dcr::payload_id&, std::vector<std::byte>&) { return false; }
  };
  const dcr::attempt_key key{0, 1, 0};
  for (unsigned mask = 0; mask < 64; ++mask) {
    CAPTURE(mask);
    list_source inner;
    for (std::uint32_t k = 0; k < 6; ++k)
      inner.items.push_back({dcr::payload_id{{0, 1, 0}, 0, k}, std::vector<std::byte>(3, std::byte{static_cast<unsigned char>(k)})});
    dcr::testing::faulty_source<list_source> source(inner, [mask](const dcr::attempt_key&, std::uint64_t n) {
      return (mask >> n) & 1u ? delivery_fault::reorder : delivery_fault::none;
    });
    const std::uint32_t owners[] = {0};
    source.open(key, owners);
    std::vector<std::uint32_t> got;
    dcr::delivery d;
    for (int guard = 0; guard < 20 && source.next(d, after(1s)) == dcr::source_status::delivered; ++guard)
      got.push_back(d.id.sequence);
    std::sort(got.begin(), got.end());
    CHECK(got == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5});
  }
}

// ---- row: two coordinators racing

TEST_CASE("two coordinators racing on one transition commit it exactly once") {
  dcr::memory_control_plane base;
  memory_cluster c(base, cluster_options{});
  c.start();
  auto& a = c.make_coordinator();
  auto& b = c.make_coordinator();
  int conflicts = 0, by_other = 0, both_at_commit = 0;
  // Even rounds: both coordinators meet just before the commit transaction (each waits up to
  // 2 s for the other), so both transactions run: only the compare-and-set keeps it to one.
  std::mutex meet_mutex;
  std::condition_variable meet;
  int at_commit = 0;
  bool rendezvous = false;
  c.before_commit = [&](memory_cluster::coordinator_handle&, const dcr::attempt_record&) {
    std::unique_lock lock(meet_mutex);
    if (!rendezvous) return;
    ++at_commit;
    meet.notify_all();
    meet.wait_for(lock, 2s, [&] { return at_commit >= 2; });
  };
  for (std::uint64_t v = 1; v <= 8; ++v) {
    CAPTURE(v);
    c.advance(v % 3 == 0 ? 0.05 : 0.01);
    // Odd rounds: a receiver fails attempt 0, so the racers also race on the fence and on
    // preparing the retry.
    const bool fail_first = v % 2 == 1;
    const int victim = static_cast<int>(v % 4);
    c.faults = [fail_first, victim](int rank, const dcr::attempt_key& k, std::uint64_t n) {
      return fail_first && rank == victim && !is_restore(k) && k.number == 0 && n == 1 ? delivery_fault::drop
                                                                                       : delivery_fault::none;
    };
    {
      std::lock_guard lock(meet_mutex);
      rendezvous = v % 2 == 0;
      at_commit = 0;
    }
    c.launch();
    std::latch go(2);
    run_outcome ra, rb;
    {
      std::jthread ta([&] {
        go.arrive_and_wait();
        ra = c.run(a, after(60s));
      });
      std::jthread tb([&] {
        go.arrive_and_wait();
        rb = c.run(b, after(60s));
      });
    }
    INFO("coordinator a " << ra.describe() << "; coordinator b " << rb.describe());
    CHECK(ra.own_commit() + rb.own_commit() == 1);
    for (const run_outcome* r : {&ra, &rb}) {
      if (r->own_commit()) continue;
      const bool other = !r->threw && r->summary.committed && r->summary.committed_by_other;
      const bool conflict = r->threw && r->code == dcr::errc::commit_conflict;
      CHECK_MESSAGE((other || conflict), r->describe());
      by_other += other ? 1 : 0;
      conflicts += conflict ? 1 : 0;
    }
    {
      std::lock_guard lock(meet_mutex);
      both_at_commit += rendezvous && at_commit >= 2 ? 1 : 0;
    }
    settle_and_verify(c, v);
    c.faults = nullptr;
    if (fail_first) CHECK(commit_now(c).attempt >= 1);  // the retry committed, not attempt 0
  }
  CHECK(c.last_verified == 4);
  CHECK(both_at_commit >= 2);  // the commit transactions really raced
  MESSAGE("racing coordinators: both ran the commit transaction in " << both_at_commit
          << " rounds; the loser saw committed_by_other " << by_other << " times, commit_conflict " << conflicts
          << " times");
}

// ---- row: the commit transaction applied, its answer lost

TEST_CASE("a commit whose answer was lost is reported as the coordinator's own commit, once") {
  dcr::memory_control_plane base;
  memory_cluster c(base, cluster_options{});
  c.start();
  auto& h = c.primary();
  for (std::uint64_t v = 1; v <= 3; ++v) {
    CAPTURE(v);
    h.plane->lose_reply_of_next_write(c.keys().commit());
    const auto r = simple_step(c, 0.02);
    INFO(r.describe());
    CHECK(r.own_commit());  // committed, and not by another coordinator
    CHECK_FALSE(r.summary.committed_by_other);
    CHECK(h.plane->replies_lost() == static_cast<int>(v));  // the answer really was lost
    CHECK(std::count_if(r.summary.attempts.begin(), r.summary.attempts.end(),
                        [](const auto& a) { return a.committed; }) == 1);
    CHECK(commit_now(c).coordinator == h.coord->incarnation());
    settle_and_verify(c, v);  // committed exactly once (audit, history, commit record)
  }
  CHECK(c.last_verified == 4);
}

// ---- row: coordinator killed before the commit, a new one started

TEST_CASE("a coordinator that died mid-attempt is replaced: the successor commits the open attempt or fences and retries it") {
  dcr::memory_control_plane base;
  memory_cluster c(base, cluster_options{});
  c.start();

  // Died just before the commit transaction, every acknowledgement in: the successor commits
  // that very attempt.
  c.advance(0.02);
  auto& dying = c.make_coordinator();
  std::optional<dcr::attempt_record> died_in;
  c.before_commit = [&](memory_cluster::coordinator_handle& h, const dcr::attempt_record& a) {
    if (&h != &dying) return;
    died_in = a;
    throw std::runtime_error("coordinator died before the commit");
  };
  c.launch();
  const auto r1 = c.run(dying, after(60s));
  CHECK_MESSAGE(r1.threw, r1.describe());
  REQUIRE(died_in.has_value());
  CHECK(c.version() == 0);
  auto& successor = c.make_coordinator();
  const auto r2 = c.run(successor, after(60s));
  REQUIRE_MESSAGE(r2.own_commit(), r2.describe());
  REQUIRE(r2.summary.attempts.size() == 1);
  CHECK(r2.summary.attempts[0].key == died_in->key);  // continued, not retried
  CHECK(commit_now(c).attempt == died_in->key.number);
  settle_and_verify(c, 1);
  c.before_commit = nullptr;

  // Cut off mid-delivery (it can no longer reach the control plane) while receiver 2 fails
  // attempt 0: the successor sees the failure, fences attempt 0 and commits an overwrite retry;
  // the old coordinator, back afterwards, must not commit anything.
  c.advance(0.02);
  auto& cut = c.make_coordinator();
  std::atomic<bool> was_cut{false};
  c.faults = [&](int rank, const dcr::attempt_key& k, std::uint64_t n) {
    if (rank == 2 && !is_restore(k) && k.target_version == 2 && k.number == 0 && n == 1) {
      cut.plane->partition(true);  // before the failure can be seen
      was_cut = true;
      return delivery_fault::drop;
    }
    return delivery_fault::none;
  };
  c.launch();
  run_outcome ra;
  {
    std::jthread ta([&] { ra = c.run(cut, after(40s)); });
    const auto until = after(30s);
    while (!was_cut && protocol_clock::now() < until) std::this_thread::sleep_for(1ms);
    REQUIRE(was_cut);
    auto& next = c.make_coordinator();
    const auto rb = c.run(next, after(60s));
    cut.plane->partition(false);  // back after its successor committed
    ta.join();
    INFO("successor " << rb.describe() << "; old coordinator " << ra.describe());
    REQUIRE(rb.own_commit());
    REQUIRE(rb.summary.attempts.size() >= 2);
    CHECK(rb.summary.attempts.front().key.number == 0);
    CHECK_FALSE(rb.summary.attempts.front().committed);
    CHECK(rb.summary.attempts.back().key.number >= 1);
    CHECK(rb.summary.attempts.back().policy == dcr::encoding_policy::overwrite_only);
    CHECK_FALSE(ra.own_commit());
    CHECK(((ra.threw && ra.code == dcr::errc::commit_conflict) || (!ra.threw && ra.summary.committed_by_other)));
  }
  settle_and_verify(c, 2);
  CHECK(c.last_verified == 4);
}

// ---- row: a receiver joining and one leaving between attempts

TEST_CASE("receivers join between attempts through a dense restore, and leave by revocation or lease expiry") {
  dcr::memory_control_plane base;
  cluster_options o;
  o.absent_at_start = {3};
  o.receiver_lease[2] = 2s;
  memory_cluster c(base, o);
  c.start();

  auto r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(settle_and_verify(c, 1) == std::vector<std::string>{"r0", "r1", "r2"});

  // r3 registers after version 1 committed, with empty storage: restored, then a member.
  c.join_receiver(3);
  r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(r.summary.restores == 1);
  bool restored_r3 = false;
  for (const auto& a : r.summary.attempts)
    if (a.kind == dcr::attempt_kind::restore)
      for (const auto& k : a.acks) restored_r3 = restored_r3 || (k.name == "r3" && k.state == dcr::ack_state::restored);
  CHECK(restored_r3);
  CHECK(settle_and_verify(c, 2).size() == 4);
  CHECK(c.live_receiver(3)->agent->restores() == 1);
  CHECK(c.last_verified == 4);

  // r1 leaves for good (stopped, lease revoked): the next transition commits without it, and
  // nothing lands in its storage any more.
  auto* r1 = c.live_receiver(1);
  const auto r1_storage = r1->state->storage;
  REQUIRE(c.kill_receiver(r1, false));
  r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  const auto without_r1 = settle_and_verify(c, 3);
  CHECK_FALSE(contains(without_r1, "r1"));
  CHECK(without_r1.size() == 3);
  const auto membership = dcr::read_record<dcr::membership_record>(c.audited(), c.keys().membership());
  REQUIRE(membership.has_value());
  CHECK_FALSE(membership->value.receivers.contains("r1"));
  CHECK(r1->state->storage.first_difference(r1_storage) == "");

  // r2 is cut off (its lease, 2 s, expires mid-transition): the attempt that required it fails,
  // the retry commits without it.
  auto* r2 = c.live_receiver(2);
  r2->plane->partition(true);
  r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  REQUIRE(r.summary.attempts.size() >= 2);
  CHECK(r.summary.attempts.front().failure.find("'r2' left") != std::string::npos);
  const auto without_r2 = settle_and_verify(c, 4);  // settle ends the partition
  CHECK_FALSE(contains(without_r2, "r2"));
  CHECK(without_r2 == std::vector<std::string>{"r0", "r3"});

  // Back, r2 finds its lease gone, registers as a new incarnation holding version 3, is
  // restored to 4 and joins.
  std::this_thread::sleep_for(400ms);  // its lease keeper notices the expiry (it retries every 100 ms)
  c.advance(0.02);
  c.launch();
  REQUIRE(c.wait_registered(2, after(10s)));
  r = c.run(c.primary(), after(60s));
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(r.summary.restores >= 1);
  CHECK(settle_and_verify(c, 5) == std::vector<std::string>{"r0", "r2", "r3"});
  CHECK(c.live_receiver(2)->agent->restores() == 1);
  CHECK(c.last_verified == 3);
}

// ---- row: a deadline passes

TEST_CASE("a receiver that stalls past the attempt deadline fails the attempt and leaves the membership") {
  // Attempts of 1.5 s; r1 hangs for 6 s in its first apply of 1 -> 2 while its lease stays alive
  // (an engine stuck, not a dead process). The attempt fails at its deadline, the fence does not
  // wait for r1 beyond another attempt_timeout, and the retry commits without it.
  dcr::memory_control_plane base;
  cluster_options o;
  o.attempt_timeout = 1500ms;
  memory_cluster c(base, o);
  c.start();
  auto r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  settle_and_verify(c, 1);
  std::atomic<bool> stalled{false};
  c.on_apply = [&](memory_cluster::receiver_inc& inc, const dcr::attempt_record& a, std::uint64_t) {
    if (inc.rank != 1 || a.kind != dcr::attempt_kind::refit || a.key.target_version != 2 || stalled.exchange(true)) return;
    std::this_thread::sleep_for(6s);
  };
  const auto t0 = protocol_clock::now();
  r = simple_step(c, 0.02);
  const double seconds = std::chrono::duration<double>(protocol_clock::now() - t0).count();
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(stalled);
  REQUIRE(r.summary.attempts.size() >= 2);
  CHECK(r.summary.attempts.front().failure == "attempt deadline passed");
  CHECK_MESSAGE(seconds < 5.0, "the transition waited " << seconds << " s for the stalled receiver");
  const auto required = settle_and_verify(c, 2);
  CHECK_FALSE(contains(required, "r1"));
  c.on_apply = nullptr;
  // Restarted (a new incarnation), r1 is restored and joins again.
  REQUIRE(c.kill_receiver_rank(1, true));
  r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(settle_and_verify(c, 3).size() == 4);
  CHECK(c.last_verified == 4);
}

// ---- row: two receivers killed in one attempt

TEST_CASE("two receivers killed in one attempt: the attempt fails, the retry commits, the restarted receivers restore") {
  for (const bool restart_at_once : {true, false}) {
    CAPTURE(restart_at_once);
    dcr::memory_control_plane base;
    memory_cluster c(base, cluster_options{});
    c.start();
    auto r = simple_step(c, 0.02);
    REQUIRE_MESSAGE(r.own_commit(), r.describe());
    settle_and_verify(c, 1);

    // The first payload r1 or r2 applies in attempt 0 of 1 -> 2 kills both (mid-apply: xor
    // records of attempt 0 are in their storage, which the restarts lose).
    std::atomic<int> killed{0};
    std::atomic<bool> once{false};
    c.on_apply = [&](memory_cluster::receiver_inc& inc, const dcr::attempt_record& a, std::uint64_t n) {
      if (a.kind != dcr::attempt_kind::refit || a.key.target_version != 2 || a.key.number != 0 || n != 1) return;
      if ((inc.rank == 1 || inc.rank == 2) && inc.generation == 0 && !once.exchange(true)) {
        for (int rank : {1, 2})
          if (c.kill_receiver_rank(rank, restart_at_once)) ++killed;
      }
    };
    r = simple_step(c, 0.02);
    REQUIRE_MESSAGE(r.own_commit(), r.describe());
    CHECK(killed == 2);
    REQUIRE(r.summary.attempts.size() >= 2);
    CHECK(r.summary.attempts.front().key.number == 0);
    CHECK_FALSE(r.summary.attempts.front().committed);
    CHECK(r.summary.attempts.back().policy == dcr::encoding_policy::overwrite_only);
    const auto required = settle_and_verify(c, 2);
    c.on_apply = nullptr;
    if (restart_at_once) {
      CHECK(r.summary.restores >= 1);  // the restarted receivers restored before the retry
      CHECK(required.size() == 4);
    } else {
      CHECK(required == std::vector<std::string>{"r0", "r3"});
      c.join_receiver(1);
      c.join_receiver(2);
      r = simple_step(c, 0.02);
      REQUIRE_MESSAGE(r.own_commit(), r.describe());
      CHECK(r.summary.restores >= 1);
      CHECK(settle_and_verify(c, 3).size() == 4);
    }
    for (int rank : {1, 2}) {
      CHECK(c.live_receiver(rank)->generation == 1);
      CHECK(c.live_receiver(rank)->agent->restores() == 1);
    }
    CHECK(c.last_verified == 4);
    CHECK(c.receiver_kills == 2);
  }
}

// ---- row: asynchronous mode with the gate

TEST_CASE("asynchronous receivers close the gate only after every payload arrived and reopen it after the commit") {
  dcr::memory_control_plane base;
  cluster_options o;
  o.asynchronous = true;
  o.audit_async_gate = true;
  memory_cluster c(base, o);
  c.start();
  std::map<int, int> took_part;
  for (std::uint64_t v = 1; v <= 4; ++v) {
    CAPTURE(v);
    c.faults = [v](int rank, const dcr::attempt_key& k, std::uint64_t n) {
      if (is_restore(k)) return delivery_fault::none;
      if (v == 2 && rank == 0 && k.number == 0 && n == 1) return delivery_fault::drop;
      if (v == 2 && rank == 2 && n == 0) return delivery_fault::duplicate;
      if (v == 3 && rank == 1 && n == 0) return delivery_fault::reorder;
      if (v == 3 && rank == 3 && n == 1) return delivery_fault::delay;
      if (v == 3 && rank == 2 && n == 2) return delivery_fault::corrupt;
      return delivery_fault::none;
    };
    const auto r = simple_step(c, 0.02);
    REQUIRE_MESSAGE(r.own_commit(), r.describe());
    if (v == 2) CHECK(r.summary.attempts.size() >= 2);
    for (const auto& n : settle_and_verify(c, v)) ++took_part[std::stoi(n.substr(1))];
    c.faults = nullptr;
    for (int rank = 0; rank < 4; ++rank) {
      auto* inc = c.live_receiver(rank);
      CHECK(inc->gate_closes == took_part[rank]);
      CHECK(inc->gate_opens == inc->gate_closes);
      CHECK_FALSE(inc->gate_closed);
    }
  }
  const auto violations = c.gate_violations();
  for (const auto& v : violations) MESSAGE(v);
  CHECK(violations.empty());
  CHECK(c.injected[static_cast<std::size_t>(delivery_fault::drop)] == 1);
  CHECK(c.last_verified == 4);

  // The same audit of a synchronous deployment finds the gate closed before payloads arrived
  // (synchronous mode closes it when the attempt starts): the check above can fail.
  dcr::memory_control_plane base2;
  cluster_options sync = o;
  sync.asynchronous = false;
  memory_cluster s(base2, sync);
  s.start();
  const auto r = simple_step(s, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  settle_and_verify(s, 1);
  CHECK_FALSE(s.gate_violations().empty());
  CHECK(s.live_receiver(0)->gate_closes == 1);
  CHECK(s.live_receiver(0)->gate_opens == 1);
}

// ---- row: the control plane down mid-transition (file store)

TEST_CASE("the file control plane away mid-transition: the transition waits or fails cleanly, nothing commits twice, it resumes") {
  temp_dir tmp;
  const auto dir = tmp.path / "control";
  dcr::file_control_plane::create(dir);
  dcr::file_control_plane base(dir);
  directory_outage away(dir, tmp.path / "control.outage");
  file_cluster c(base, cluster_options{});
  c.start();

  // The outage starts at the first payload a receiver applies in transition `outage_target`,
  // for `outage_ms`.
  std::atomic<std::uint64_t> outage_target{1};
  std::atomic<int> outage_ms{1500};
  std::atomic<bool> started{false};
  c.on_apply = [&](file_cluster::receiver_inc&, const dcr::attempt_record& a, std::uint64_t) {
    if (a.kind != dcr::attempt_kind::refit || a.key.target_version != outage_target || started.exchange(true)) return;
    away.begin();
    c.spawn([&, ms = outage_ms.load()] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      away.end();
    });
  };

  // 1: away for 1.5 s while receivers apply: the transition waits and commits.
  auto r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(away.count == 1);
  settle_and_verify(c, 1);

  // 2: away for 1 s just before the commit transaction: the commit waits it out.
  outage_target = 0;
  c.before_commit = [&](file_cluster::coordinator_handle&, const dcr::attempt_record& a) {
    if (a.key.target_version != 2 || away.count != 1) return;
    away.begin();
    c.spawn([&] {
      std::this_thread::sleep_for(1000ms);
      away.end();
    });
  };
  r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(r.summary.attempts.size() == 1);
  CHECK(away.count == 2);
  settle_and_verify(c, 2);
  c.before_commit = nullptr;

  // 3: away for 4 s, longer than the coordinator's deadline: it fails cleanly (a clear
  // deadline_exceeded, nothing committed); once the store is back, a new coordinator finishes
  // the transition, which the agents (deadlines of their own) waited out.
  started = false;
  outage_ms = 4000;
  outage_target = 3;
  c.advance(0.02);
  c.launch();
  const auto failed = c.run(c.primary(), after(2500ms));
  CHECK(failed.threw);
  CHECK_MESSAGE(failed.code == dcr::errc::deadline_exceeded, failed.describe());
  CHECK(failed.what.find("control plane unavailable") != std::string::npos);
  const auto until = after(20s);
  while (away.active() && protocol_clock::now() < until) std::this_thread::sleep_for(10ms);
  REQUIRE_FALSE(away.active());
  CHECK(away.count == 3);
  CHECK(c.version() == 2);
  auto& next = c.make_coordinator();
  r = c.run(next, after(60s));
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  settle_and_verify(c, 3);
  c.on_apply = nullptr;
  CHECK(c.last_verified == 4);
}

TEST_CASE("an outage longer than every lease: every agent comes back as a new incarnation, the transition still commits once") {
  // Leases of 2 s and an outage of 3.5 s at the first payload applied: every registration has
  // expired when the control plane comes back; owners and receivers register again (receivers
  // holding writes of the open attempt as not restored), and the deployment converges.
  dcr::memory_control_plane base;
  cluster_options o;
  for (int r = 0; r < o.receivers; ++r) o.receiver_lease[r] = 2s;
  o.owner_lease = 2s;
  memory_cluster c(base, o);
  c.start();
  auto r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  settle_and_verify(c, 1);
  std::atomic<bool> started{false};
  c.on_apply = [&](memory_cluster::receiver_inc&, const dcr::attempt_record& a, std::uint64_t) {
    if (a.kind != dcr::attempt_kind::refit || a.key.target_version != 2 || started.exchange(true)) return;
    c.outage().begin();
    c.spawn([&] {
      std::this_thread::sleep_for(3500ms);
      c.outage().end();
    });
  };
  r = simple_step(c, 0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(started);
  const auto required = settle_and_verify(c, 2);
  c.on_apply = nullptr;
  MESSAGE("after the long outage: " << r.summary.attempts.size() << " attempts, " << r.summary.restores
                                    << " restores, " << required.size() << " receivers in the commit");
  // Whoever the commit did not include is restored by the next transitions.
  for (std::uint64_t v = 3; v <= 5 && c.last_verified < 4; ++v) {
    r = simple_step(c, 0.02);
    REQUIRE_MESSAGE(r.own_commit(), r.describe());
    settle_and_verify(c, v);
  }
  CHECK(c.last_verified == 4);
}

// ---- owners building on several threads (owner_agent_options::build_threads)

namespace {

/// A memory store that keeps every payload after the commit (the coordinator's cleanup does
/// nothing), so that two deployments' payloads can be compared afterwards.
class keeping_store : public dcr::memory_payload_store {
 public:
  void erase_through(std::uint64_t) {}
};
using keeping_cluster = cluster<dcr::memory_control_plane, keeping_store>;

/// Every attempt's manifests and payload bytes, owner by owner, and the owners' report figures
/// of the committed transitions 1 .. `transitions` of a deployment whose owners build on
/// `threads` threads.
struct owner_output {
  std::vector<std::pair<dcr::payload_id, std::vector<std::byte>>> payloads;
  std::vector<std::vector<dcr::payload_id>> manifests;
  std::vector<std::vector<std::uint64_t>> reports;  ///< per owner report: every count and digest
};

owner_output refit_with_build_threads(std::size_t threads, std::uint64_t transitions) {
  dcr::memory_control_plane base;
  cluster_options o;
  o.owner_build_threads = threads;
  keeping_cluster c(base, o);
  c.start();
  for (std::size_t k = 0; k < c.owner_count(); ++k)
    REQUIRE(c.live_owner(k)->owner->chunk_count() > 1);  // the threads share chunks
  owner_output out;
  for (std::uint64_t v = 1; v <= transitions; ++v) {
    const auto r = simple_step(c, 0.03);
    REQUIRE_MESSAGE(r.own_commit(), r.describe());
    settle_and_verify(c, v);
    for (const auto& a : r.summary.attempts) {
      for (const auto& listing : c.store().list(a.key)) {
        CHECK(listing.complete);
        out.manifests.push_back(listing.ids);
        for (const auto& id : listing.ids) {
          std::vector<std::byte> bytes;
          REQUIRE(c.store().get(id, bytes) == dcr::get_status::found);
          out.payloads.emplace_back(id, std::move(bytes));
        }
      }
      for (const auto& rep : a.reports) {
        CHECK(rep.built);
        out.reports.push_back({rep.owner, rep.payloads, rep.payload_bytes, rep.records,
                               rep.change_digest, rep.manifest_digest, rep.payload_set_digest,
                               rep.stats.items, rep.stats.changed_elements,
                               rep.stats.residual_changed_elements});
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("owners building on 2 and 3 threads put the one-thread build's payloads and manifests, and commit bit-exact") {
  const owner_output one = refit_with_build_threads(1, 3);
  REQUIRE(one.payloads.size() > 3);
  for (std::size_t threads : {2, 3}) {
    CAPTURE(threads);
    const owner_output many = refit_with_build_threads(threads, 3);
    CHECK(many.manifests == one.manifests);
    CHECK(many.payloads == one.payloads);
    CHECK(many.reports == one.reports);
  }
}

TEST_CASE("an owner whose threaded build fails reports it as the one-thread build does, and nothing is committed") {
  for (std::size_t threads : {1, 2}) {
    CAPTURE(threads);
    dcr::memory_control_plane base;
    cluster_options o;
    o.owner_build_threads = threads;
    o.max_attempts = 2;
    o.attempt_timeout = 5s;
    memory_cluster c(base, o);
    c.start();
    // Every residual conversion throws, on whichever thread builds it.
    c.on_convert = [] { throw dcr::error(dcr::errc::invalid_argument, "conversion failed (test)"); };
    const auto r = simple_step(c, 0.03, 30s);
    CHECK_FALSE(r.own_commit());
    CHECK(c.version() == 0);
    CHECK(commit_now(c).version == 0);
    std::size_t failed = 0;
    for (const auto& a : r.summary.attempts) {
      CHECK_FALSE(a.committed);
      for (const auto& rep : a.reports)
        if (!rep.built && rep.failure.find("conversion failed (test)") != std::string::npos) ++failed;
    }
    CHECK_MESSAGE(failed > 0, r.describe());
    for (std::size_t k = 0; k < c.owner_count(); ++k)
      CHECK(c.live_owner(k)->agent->tracker_version() == 0);
    (void)c.settle({}, 1s);
  }
}

// ---- the randomized soak

namespace {

struct soak_totals {
  std::uint64_t seeds = 0, transitions = 0, commits = 0, refit_attempts = 0, restores = 0;
  std::uint64_t receiver_kills = 0, owner_kills = 0, coordinator_replacements = 0, coordinator_races = 0;
  std::uint64_t outages = 0, leaves = 0, joins = 0, verified = 0;
  std::array<std::uint64_t, fault_kinds> faults{};  ///< delivery faults chosen, by kind (a stale
                                                    ///< one delivers only if a fenced payload is kept)
};

dcr::sim::moe_config soak_model(dcr::sim::rng& g) {
  dcr::sim::moe_config c;
  const dcr::dtype types[] = {dcr::dtype::bf16, dcr::dtype::f16, dcr::dtype::f32};
  c.type = types[g.next() % 3];
  c.hidden = 16 + static_cast<std::int64_t>(g.next() % 4) * 16;
  c.kv_dim = 4 + static_cast<std::int64_t>(g.next() % 13);
  c.dense_ffn = 24 + static_cast<std::int64_t>(g.next() % 64);
  c.expert_ffn = 4 + static_cast<std::int64_t>(g.next() % 24);
  c.experts = 2 + static_cast<std::int64_t>(g.next() % 6);
  c.layers = 2 + static_cast<std::int64_t>(g.next() % 2);
  c.vocab = 5 + static_cast<std::int64_t>(g.next() % 200);
  return c;
}

// One seed: `transitions` transitions with random faults, then clean transitions until every
// serving rank is back and bit-exact.
void soak_seed(std::uint64_t seed, std::uint64_t transitions, time_point stop_at, soak_totals& st) {
  dcr::sim::rng g(seed * 0x9e3779b97f4a7c15ull + 1);
  const bool trace = env_u64("DCR_SOAK_TRACE", 0) != 0;
  cluster_options o;
  o.seed = seed;
  o.model = soak_model(g);
  o.trainer = g.next() % 2 ? dcr::sim::trainer_layout::megatron : dcr::sim::trainer_layout::plain;
  for (int r = 0; r < o.receivers; ++r)
    o.layouts.push_back(g.next() % 3 ? dcr::sim::engine_layout::serving : dcr::sim::engine_layout::plain);
  o.path = g.next() % 3 ? dcr::apply_path::compiled : dcr::apply_path::general;
  o.asynchronous = g.next() % 3 == 0;
  o.bucket_bytes = 256 + g.next() % 4096;
  o.chunk_bytes = 2048 + g.next() % 32768;
  o.max_attempts = 8;
  dcr::memory_control_plane base;
  memory_cluster c(base, o);
  c.start();
  const double rates[] = {0.0, 0.0005, 0.002, 0.01, 0.03, 0.1};
  const delivery_fault kinds[] = {delivery_fault::duplicate, delivery_fault::corrupt, delivery_fault::drop,
                                  delivery_fault::delay,     delivery_fault::reorder, delivery_fault::stale,
                                  delivery_fault::lose};
  auto present = [&] {
    std::vector<int> out;
    for (int r = 0; r < c.receiver_ranks(); ++r)
      if (c.live_receiver(r) != nullptr) out.push_back(r);
    return out;
  };
  std::uint64_t extra = 0;   // clean transitions at the end
  std::uint64_t leaves = 0;  // receivers stopped for good between transitions (until they join)
  for (std::uint64_t t = 1;; ++t) {
    const bool chaos = t <= transitions && protocol_clock::now() < stop_at;
    if (!chaos) {
      // Every absent rank comes back; clean transitions until all of them hold the version.
      for (int r = 0; r < c.receiver_ranks(); ++r)
        if (c.live_receiver(r) == nullptr) {
          c.join_receiver(r);
          ++st.joins;
        }
      if (extra > 0 && c.last_verified == static_cast<std::size_t>(c.receiver_ranks())) break;
      REQUIRE_MESSAGE(extra < 3, "seed " << seed << ": receivers not back after 3 clean transitions");
      ++extra;
    }
    const std::uint64_t v = c.version() + 1;
    CAPTURE(seed);
    CAPTURE(v);
    // Membership between transitions.
    if (chaos) {
      for (int r = 0; r < c.receiver_ranks(); ++r)
        if (c.live_receiver(r) == nullptr && g.uniform() < 0.5) {
          c.join_receiver(r);
          ++st.joins;
        }
      if (auto p = present(); p.size() >= 3 && g.uniform() < 0.06) {
        c.kill_receiver_rank(p[g.next() % p.size()], false);
        ++leaves;
      }
    }
    // This transition's faults.
    struct event {
      int rank;
      std::uint32_t attempt;
      std::uint64_t ordinal;
      delivery_fault kind;
    };
    std::vector<event> events;
    const std::size_t n_events = chaos ? g.next() % 3 : 0;
    for (std::size_t k = 0; k < n_events; ++k)
      events.push_back({static_cast<int>(g.next() % 4), static_cast<std::uint32_t>(g.next() % 2), g.next() % 4,
                        kinds[g.next() % std::size(kinds)]});
    const bool kill_rx = chaos && g.uniform() < 0.2;
    const int kill_rank = static_cast<int>(g.next() % 4);
    const std::uint64_t kill_at = 1 + g.next() % 2;
    const bool kill_rx_now = g.uniform() < 0.5;
    const bool kill_in_restore = g.uniform() < 0.2;
    const bool kill_ow = chaos && g.uniform() < 0.12;
    const std::size_t kill_owner = g.next() % c.owner_count();
    const int owner_restart_ms = g.uniform() < 0.5 ? -1 : static_cast<int>(g.next() % 300);  // -1: at once
    const int abandon = chaos && g.uniform() < 0.15 ? 1 + static_cast<int>(g.next() % 2) : 0;  // 1 mid, 2 before commit
    const bool abandon_in_restore = g.uniform() < 0.3;  // mid: at the first delivery of a restore, too
    const bool race = g.uniform() < 0.5;
    const int race_ms = static_cast<int>(g.next() % 200);
    const bool outage = chaos && g.uniform() < 0.2;
    const int outage_at = static_cast<int>(g.next() % 150), outage_ms = 100 + static_cast<int>(g.next() % 400);
    const double rate = chaos ? rates[g.next() % 6] : 0.01;

    auto* A = &c.primary();
    std::atomic<bool> abandoned{false}, rx_killed{false}, ow_killed{false};
    c.faults = [&](int rank, const dcr::attempt_key& k, std::uint64_t n) {
      if (abandon == 1 && (abandon_in_restore || !is_restore(k)) && !abandoned.exchange(true)) A->plane->partition(true);
      if (is_restore(k)) return delivery_fault::none;
      for (const auto& e : events)
        if (e.rank == rank && e.attempt == k.number && e.ordinal == n) return e.kind;
      return delivery_fault::none;
    };
    c.before_commit = [&](memory_cluster::coordinator_handle& h, const dcr::attempt_record&) {
      if (abandon == 2 && &h == A && !abandoned.exchange(true)) h.plane->partition(true);
    };
    c.on_apply = [&](memory_cluster::receiver_inc& inc, const dcr::attempt_record& a, std::uint64_t n) {
      const bool kind_ok = kill_in_restore ? a.kind == dcr::attempt_kind::restore : a.kind == dcr::attempt_kind::refit;
      if (kill_rx && inc.rank == kill_rank && kind_ok && n == kill_at && !rx_killed.exchange(true))
        c.kill_receiver(&inc, kill_rx_now);
    };
    c.on_put = [&](memory_cluster::owner_inc& inc, const dcr::attempt_record& a, std::uint64_t n) {
      const bool kind_ok = kill_in_restore ? a.kind == dcr::attempt_kind::restore : a.kind == dcr::attempt_kind::refit;
      if (!kill_ow || inc.slot != kill_owner || !kind_ok || n != 1 || ow_killed.exchange(true)) return;
      if (owner_restart_ms < 0) {
        c.kill_owner(&inc, true);
      } else if (c.kill_owner(&inc, false)) {
        c.spawn([&c, k = kill_owner, ms = owner_restart_ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
          c.restart_owner(k);
        });
      }
    };
    if (outage)
      c.spawn([&c, outage_at, outage_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(outage_at));
        c.outage().begin();
        std::this_thread::sleep_for(std::chrono::milliseconds(outage_ms));
        c.outage().end();
      });

    if (trace)
      std::printf("soak seed %llu v %llu: rate %g events %zu kill_rx %d(rank %d at %llu now %d restore %d) "
                  "kill_owner %d(%zu, %d ms) abandon %d(restore %d race %d) outage %d(%d+%d ms) present %zu\n",
                  static_cast<unsigned long long>(seed), static_cast<unsigned long long>(v), rate, events.size(),
                  kill_rx, kill_rank, static_cast<unsigned long long>(kill_at), kill_rx_now, kill_in_restore,
                  kill_ow, kill_owner, owner_restart_ms, abandon, abandon_in_restore, race, outage, outage_at,
                  outage_ms, present().size());
    for (const auto& e : events)
      if (trace) std::printf("  fault %s rank %d attempt %u ordinal %llu\n", fault_name(e.kind), e.rank, e.attempt,
                             static_cast<unsigned long long>(e.ordinal));
    c.advance(rate);
    c.launch();
    run_outcome ra, rb, winner;
    std::atomic<bool> a_done{false};
    {
      std::jthread ta([&] {
        ra = c.run(*A, after(60s));
        a_done = true;
      });
      const auto until = after(90s);
      while (!a_done && !A->plane->partitioned() && protocol_clock::now() < until)
        std::this_thread::sleep_for(1ms);
      if (!a_done && A->plane->partitioned()) {
        // The coordinator is gone (cut off): a new one takes over. The old one comes back while
        // the new one runs (a race on the same transition) or after it committed.
        ++st.coordinator_replacements;
        auto& B = c.make_coordinator();
        if (race) {
          ++st.coordinator_races;
          c.spawn([A, race_ms] {
            std::this_thread::sleep_for(std::chrono::milliseconds(race_ms));
            A->plane->partition(false);
          });
        }
        rb = c.run(B, after(60s));
        A->plane->partition(false);
        const auto grace = after(5s);
        while (!a_done && protocol_clock::now() < grace) std::this_thread::sleep_for(1ms);
        if (!a_done) A->plane->tear_down();  // stuck waiting for a transition that is over
        ta.join();
        c.set_primary(B);
        INFO("old coordinator " << ra.describe() << "; new one " << rb.describe());
        CHECK(ra.own_commit() + rb.own_commit() == 1);
        winner = rb.own_commit() ? rb : ra;
        // The old one: lost (by_other / conflict), or stuck and torn down, never a second commit.
      } else {
        ta.join();
        winner = ra;
      }
    }
    INFO("winner " << winner.describe());
    REQUIRE(winner.own_commit());
    REQUIRE(c.version() == v);
    const auto required = applied_in_commit(winner.summary);
    CHECK(c.settle(required) == "");
    CHECK(c.verify(v, required) == "");
    c.faults = nullptr;
    c.on_apply = nullptr;
    c.on_put = nullptr;
    c.before_commit = nullptr;
    ++st.transitions;
    ++st.commits;
    st.outages += outage ? 1 : 0;
    st.restores += winner.summary.restores;
    for (const auto& a : winner.summary.attempts) st.refit_attempts += a.kind == dcr::attempt_kind::refit ? 1 : 0;
  }
  st.leaves += leaves;
  st.receiver_kills += c.receiver_kills - leaves;  // kill_receiver counts the leaves too
  st.owner_kills += c.owner_kills;
  st.verified += c.verified_receivers_;
  for (std::size_t k = 0; k < fault_kinds; ++k) st.faults[k] += c.injected[k];
  ++st.seeds;
}

}  // namespace

TEST_CASE("randomized soak: seeds x transitions x random faults, every commit once and bit-exact") {
  const std::uint64_t seconds = env_u64("DCR_SOAK_SECONDS", 0);
  const std::uint64_t seeds = env_u64("DCR_SOAK_SEEDS", seconds > 0 ? ~std::uint64_t{0} : 8);
  const std::uint64_t transitions = env_u64("DCR_SOAK_TRANSITIONS", 25);
  const auto t0 = protocol_clock::now();
  // Without DCR_SOAK_SECONDS the size is fixed; 150 s is only a safety bound for a slow machine.
  const auto stop_at = t0 + std::chrono::seconds(seconds > 0 ? seconds : 150);
  soak_totals st;
  const std::uint64_t first = env_u64("DCR_SOAK_FIRST_SEED", 1);  // to rerun one seed of a long soak
  for (std::uint64_t k = 0; k < seeds && protocol_clock::now() < stop_at; ++k) soak_seed(first + k, transitions, stop_at, st);
  const double elapsed = std::chrono::duration<double>(protocol_clock::now() - t0).count();
  std::printf(
      "agents soak: seeds=%llu transitions=%llu commits=%llu refit_attempts=%llu retries=%llu restores=%llu "
      "faults{duplicate=%llu corrupt=%llu drop=%llu delay=%llu reorder=%llu stale=%llu} receiver_kills=%llu "
      "owner_kills=%llu coordinator_replacements=%llu (races=%llu) outages=%llu leaves=%llu joins=%llu "
      "receivers_verified=%llu seconds=%.1f\n",
      static_cast<unsigned long long>(st.seeds), static_cast<unsigned long long>(st.transitions),
      static_cast<unsigned long long>(st.commits), static_cast<unsigned long long>(st.refit_attempts),
      static_cast<unsigned long long>(st.refit_attempts - st.commits), static_cast<unsigned long long>(st.restores),
      static_cast<unsigned long long>(st.faults[1]), static_cast<unsigned long long>(st.faults[2]),
      static_cast<unsigned long long>(st.faults[3]), static_cast<unsigned long long>(st.faults[4]),
      static_cast<unsigned long long>(st.faults[5]), static_cast<unsigned long long>(st.faults[6]),
      static_cast<unsigned long long>(st.receiver_kills), static_cast<unsigned long long>(st.owner_kills),
      static_cast<unsigned long long>(st.coordinator_replacements), static_cast<unsigned long long>(st.coordinator_races),
      static_cast<unsigned long long>(st.outages), static_cast<unsigned long long>(st.leaves),
      static_cast<unsigned long long>(st.joins), static_cast<unsigned long long>(st.verified), elapsed);
  std::fflush(stdout);
  CHECK(st.commits == st.transitions);
  CHECK(st.seeds >= 1);
}
