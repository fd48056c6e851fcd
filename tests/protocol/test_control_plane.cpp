// Control planes: the laws every implementation keeps (control_plane_laws.hpp), run against the
// memory and file stores, plus what only the file store must survive: a process killed (or an
// I/O step failing) at every step of a transaction, whatever operation comes next; a vanished
// directory; foreign and damaged files in it. And the lease keeper, which must outlive any
// exception a renewal throws.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "control_plane_laws.hpp"
#include "dcr/protocol/agent_support.hpp"
#include "dcr/protocol/plane/file_control_plane.hpp"
#include "dcr/protocol/plane/memory_control_plane.hpp"

namespace {

using namespace std::chrono_literals;

struct temp_dir {
  std::filesystem::path path;
  // `base`: where (the crash-point test uses /dev/shm: a killed process cannot lose what an
  // fsync would have kept, so the fsyncs only cost time there).
  explicit temp_dir(const char* base = "/tmp") {
    std::string tmpl = std::string(std::filesystem::is_directory(base) ? base : "/tmp") +
                       "/dcr-cp-XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("memory control plane keeps the control-plane laws") {
  dcr::memory_control_plane plane;
  dcr_test::check_control_plane_laws(plane, plane);
}

TEST_CASE("file control plane keeps the control-plane laws across two handles") {
  temp_dir dir;
  dcr::file_control_plane::create(dir.path);
  dcr::file_control_plane a(dir.path), b(dir.path);
  dcr_test::check_control_plane_laws(a, b);
}

TEST_CASE("file control plane refuses a directory that is not one, and reports a vanished one") {
  temp_dir dir;
  try {
    dcr::file_control_plane plane(dir.path / "nothing-here");
    FAIL("opened a missing directory");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == dcr::errc::control_plane_unavailable);
    CHECK(std::string(e.what()).find("nothing-here") != std::string::npos);
  }
  dcr::file_control_plane::create(dir.path / "cp");
  dcr::file_control_plane plane(dir.path / "cp");
  CHECK(dcr::put_if(plane, "/dcr/commit", "v0", 0));
  std::filesystem::rename(dir.path / "cp", dir.path / "cp.away");  // an outage
  try {
    (void)plane.get("/dcr/commit");
    FAIL("read from a vanished directory");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == dcr::errc::control_plane_unavailable);
    CHECK(std::string(e.what()).find("/dcr/commit") != std::string::npos);
  }
  CHECK_THROWS_AS(dcr::put(plane, "/dcr/x", "y"), dcr::error);
  CHECK_FALSE(std::filesystem::exists(dir.path / "cp"));  // never silently recreated
  std::filesystem::rename(dir.path / "cp.away", dir.path / "cp");  // back
  CHECK(plane.get("/dcr/commit")->value == "v0");
}

TEST_CASE("file control plane: a transaction killed at any point is all or nothing") {
  // A child writes a two-key transaction; it is killed after a random number of microseconds.
  // Afterwards the two keys either both hold the new values or both the old ones.
  temp_dir dir;
  dcr::file_control_plane::create(dir.path);
  dcr::file_control_plane plane(dir.path);
  dcr::put(plane, "/k/a", "old");
  dcr::put(plane, "/k/b", "old");
  int both_new = 0, both_old = 0;
  for (int trial = 0; trial < 40; ++trial) {
    dcr::put(plane, "/k/a", "old");
    dcr::put(plane, "/k/b", "old");
    const pid_t pid = ::fork();
    if (pid == 0) {
      dcr::file_control_plane child(dir.path);
      const dcr::key_write w[] = {{"/k/a", "new", 0, false}, {"/k/b", "new", 0, false}};
      child.transact({}, w);
      ::_exit(0);
    }
    ::usleep(static_cast<useconds_t>(trial * 97 % 3000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const auto a = plane.get("/k/a")->value;
    const auto b = plane.get("/k/b")->value;
    CHECK(a == b);
    both_new += a == "new" && b == "new";
    both_old += a == "old" && b == "old";
  }
  CHECK(both_new + both_old == 40);
  MESSAGE("killed transactions: " << both_new << " rolled forward, " << both_old << " lost whole");
}

// ---- crash points: every write, fsync, rename and unlink of a transaction

namespace {

// A plane holding version 3 of a deployment: the commit record, the open attempt, history/3, a
// receiver registration under lease `doomed` and a second live lease `kept`. The transaction
// under test is the coordinator's commit of version 4 (commit, attempt, history/4, with the
// coordinator's compares). After the crash the test lets `doomed` expire, so that whatever
// operation comes next and collects expired leases runs a transaction of its own.
struct commit_fixture {
  std::filesystem::path dir;
  std::int64_t commit_rev = 0, attempt_rev = 0, revision0 = 0;
  dcr::lease_id doomed = 0, kept = 0;

  explicit commit_fixture(std::filesystem::path d) : dir(std::move(d)) {
    dcr::file_control_plane::create(dir);
    dcr::file_control_plane p(dir);
    dcr::put(p, "/dcr/history/3", "v3");
    dcr::put(p, "/dcr/commit", "v3");
    dcr::put(p, "/dcr/attempt", "open");
    doomed = p.grant_lease(600s);
    kept = p.grant_lease(600s);
    dcr::put(p, "/dcr/receivers/r9", "alive", doomed);
    commit_rev = p.get("/dcr/commit")->revision;
    attempt_rev = p.get("/dcr/attempt")->revision;
    revision0 = p.revision();
  }
  commit_fixture(const commit_fixture& seed, std::filesystem::path d) : commit_fixture(seed) {
    dir = std::move(d);
    std::filesystem::copy(seed.dir, dir, std::filesystem::copy_options::recursive);
  }

  bool commit(dcr::file_control_plane& p) const {
    const dcr::key_compare cmp[] = {
        {"/dcr/commit", commit_rev}, {"/dcr/attempt", attempt_rev}, {"/dcr/history/4", 0}};
    const dcr::key_write w[] = {{"/dcr/commit", "v4", 0, false},
                                {"/dcr/attempt", "committed", 0, false},
                                {"/dcr/history/4", "v4", 0, false}};
    return p.transact(cmp, w);
  }
  // Time passes: `doomed` expires (its file says so; the plane reads nothing else).
  void expire_doomed() const {
    std::ofstream(dir / "leases" / std::to_string(doomed), std::ios::trunc) << "1 600";
  }
  [[nodiscard]] bool doomed_record_on_disk() const {
    return std::filesystem::exists(dir / "records" / "%2Fdcr%2Freceivers%2Fr9");
  }
};

// What the first operation after the crash saw.
struct seen_by_op {
  std::optional<std::string> commit;
  std::optional<std::int64_t> revision;
};

struct first_op {
  const char* name;
  bool collects;  // collects expired leases (a transaction of its own)
  bool writes;    // writes a record of its own (one more transaction)
  std::function<void(dcr::file_control_plane&, const commit_fixture&, seen_by_op&)> run;
};

const std::vector<first_op>& first_ops() {
  static const std::vector<first_op> ops = {
      {"keep_alive", true, false,
       [](auto& p, const auto& f, auto&) { CHECK(p.keep_alive(f.kept)); }},
      {"transact", true, true, [](auto& p, const auto&, auto&) { dcr::put(p, "/dcr/other", "x"); }},
      {"wait_for_change", true, false,
       [](auto& p, const auto&, auto&) {
         (void)p.wait_for_change("/dcr/", 1 << 30, dcr::protocol_clock::now());
       }},
      {"grant_lease", false, false,
       [](auto& p, const auto& f, auto&) { CHECK(p.grant_lease(60s) > f.kept); }},
      {"revoke", false, false, [](auto& p, const auto& f, auto&) { p.revoke(f.kept); }},
      {"get", false, false,
       [](auto& p, const auto&, auto& seen) { seen.commit = p.get("/dcr/commit")->value; }},
      {"list", false, false,
       [](auto& p, const auto&, auto& seen) {
         for (const auto& r : p.list("/dcr/"))
           if (r.key == "/dcr/commit") seen.commit = r.value;
       }},
      {"revision", false, false,
       [](auto& p, const auto&, auto& seen) { seen.revision = p.revision(); }},
  };
  return ops;
}

// After the crash at step `n` and the first operation: all or nothing (rolled forward if the
// crash came after the commit point), one revision per transaction (none reused), history/4
// exactly once, and the coordinator's retry of the commit succeeds exactly when it was lost.
// Returns whether the transaction had been rolled forward (before the retry).
bool check_after_crash(const commit_fixture& f, const first_op& op, const seen_by_op& seen,
                       bool past_commit_point) {
  dcr::file_control_plane q(f.dir);
  const auto c = q.get("/dcr/commit");
  const auto a = q.get("/dcr/attempt");
  const auto h = q.get("/dcr/history/4");
  REQUIRE(c.has_value());
  REQUIRE(a.has_value());
  const bool rolled = c->value == "v4";
  if (rolled) {
    CHECK(a->value == "committed");
    REQUIRE(h.has_value());
    CHECK(h->value == "v4");
    CHECK(c->revision == f.revision0 + 1);
    CHECK(a->revision == c->revision);
    CHECK(h->revision == c->revision);
  } else {
    CHECK(c->value == "v3");
    CHECK(a->value == "open");
    CHECK_FALSE(h.has_value());
    CHECK(c->revision == f.commit_rev);
    CHECK(a->revision == f.attempt_rev);
  }
  if (past_commit_point) CHECK_MESSAGE(rolled, "a transaction past its commit point was lost");
  const bool collected = !f.doomed_record_on_disk();
  if (op.collects) CHECK(collected);
  const auto rev = q.revision();
  CHECK(rev == f.revision0 + (rolled ? 1 : 0) + (collected ? 1 : 0) + (op.writes ? 1 : 0));
  for (const auto& r : q.list("")) CHECK(r.revision <= rev);
  if (seen.commit) CHECK(*seen.commit == c->value);
  if (seen.revision) CHECK(*seen.revision == f.revision0 + (rolled ? 1 : 0));
  // The retry collects `doomed` first if nothing did yet (one transaction), then commits if
  // the crash lost the commit (another).
  CHECK(f.commit(q) == !rolled);
  CHECK(q.get("/dcr/commit")->value == "v4");
  CHECK(q.get("/dcr/history/4").has_value());
  CHECK(q.revision() == rev + (rolled ? 0 : 1) + (collected ? 0 : 1));
  CHECK_FALSE(f.commit(q));
  CHECK(q.revision() == rev + (rolled ? 0 : 1) + (collected ? 0 : 1));
  return rolled;
}

}  // namespace

TEST_CASE("file control plane: a writer killed or failing at any step of a transaction, then any operation: all or nothing, history once, no revision reused") {
  temp_dir root("/dev/shm");
  const commit_fixture seed(root.path / "seed");
  // The steps of the transaction, in order, and its commit point (the journal's rename).
  std::vector<std::pair<std::string, std::filesystem::path>> steps;
  {
    const commit_fixture dry(seed, root.path / "dry");
    dcr::file_control_plane p(dry.dir);
    p.set_step_hook([&](std::string_view s, const std::filesystem::path& path) {
      steps.emplace_back(std::string(s), path);
    });
    REQUIRE(dry.commit(p));
  }
  const auto commit_point = std::find(steps.begin(), steps.end(),
                                      std::pair<std::string, std::filesystem::path>(
                                          "rename", root.path / "dry" / "journal"));
  REQUIRE(commit_point != steps.end());
  const auto commit_index = static_cast<std::size_t>(commit_point - steps.begin());
  REQUIRE(steps.size() > commit_index + 4);  // records, revision and journal removal follow
  int cases = 0, rolled_forward = 0;
  for (const char* mode : {"killed", "failed"}) {
    // n == steps.size(): the transaction completes without reaching the hook.
    for (std::size_t n = 0; n <= steps.size(); ++n) {
      for (const auto& op : first_ops()) {
        CAPTURE(std::string(mode));
        CAPTURE(n);
        CAPTURE(std::string(op.name));
        if (n < steps.size()) {
          CAPTURE(steps[n].first);
          CAPTURE(steps[n].second.filename().string());
        }
        const commit_fixture f(seed, root.path / ("case-" + std::to_string(cases++)));
        dcr::file_control_plane p(f.dir);
        if (std::string_view(mode) == "killed") {
          const pid_t pid = ::fork();
          REQUIRE(pid >= 0);
          if (pid == 0) {
            std::size_t at = 0;
            p.set_step_hook([&](std::string_view, const std::filesystem::path&) {
              if (at++ == n) ::_exit(10);
            });
            try {
              (void)f.commit(p);
            } catch (...) {
              ::_exit(20);
            }
            ::_exit(0);
          }
          int status = 0;
          REQUIRE(::waitpid(pid, &status, 0) == pid);
          REQUIRE(WIFEXITED(status));
          CHECK(WEXITSTATUS(status) == (n < steps.size() ? 10 : 0));
        } else {
          std::size_t at = 0;
          p.set_step_hook([&](std::string_view s, const std::filesystem::path& path) {
            if (at++ == n)
              throw dcr::error(dcr::errc::io_error,
                               "injected failure of " + std::string(s) + " '" + path.string() + "'");
          });
          if (n < steps.size()) {
            try {
              (void)f.commit(p);
              FAIL("the injected failure did not fail the transaction");
            } catch (const dcr::error& e) {
              CHECK(e.dcr_code() == dcr::errc::control_plane_unavailable);
              CHECK(std::string(e.what()).find("injected failure") != std::string::npos);
            }
          } else {
            CHECK(f.commit(p));
          }
          p.set_step_hook({});  // the same handle goes on (as with_retry would)
        }
        f.expire_doomed();
        seen_by_op seen;
        if (std::string_view(mode) == "killed") {
          dcr::file_control_plane next(f.dir);  // the next process
          op.run(next, f, seen);
        } else {
          op.run(p, f, seen);
        }
        rolled_forward += check_after_crash(f, op, seen, n > commit_index) ? 1 : 0;
        std::error_code ec;
        std::filesystem::remove_all(f.dir, ec);
      }
    }
  }
  MESSAGE("crash points: " << steps.size() << " steps (commit point at " << commit_index
                           << "), " << cases << " cases, " << rolled_forward
                           << " rolled forward, the others lost whole and committed by the retry");
}

// ---- foreign and damaged files

TEST_CASE("file control plane: foreign files in records/ and leases/ are skipped and named, never fatal") {
  temp_dir dir;
  dcr::file_control_plane::create(dir.path);
  dcr::file_control_plane plane(dir.path);
  std::map<std::string, std::string> reported;
  int reports = 0;
  plane.set_foreign_file_sink([&](const std::filesystem::path& path, const std::string& why) {
    reported[path.filename().string()] = why;
    ++reports;
  });
  dcr::put(plane, "/dcr/receivers/r0", "a");
  const dcr::lease_id l = plane.grant_lease(60s);
  dcr::put(plane, "/dcr/receivers/r1", "b", l);
  const auto revision0 = plane.revision();
  const auto stray = [&](const std::filesystem::path& p) { std::ofstream(p) << "not ours\n"; };
  // records/: a bad escape, a lower-case escape of a live key's name, characters the encoder
  // never writes, a directory; leases/: ids out of range, not decimal, zero, a leading zero.
  for (const char* name : {"%zz", "%2fdcr%2freceivers%2fr0", "notes+1", "x~", "%2Fdcr%2Freceivers%2F%"})
    stray(dir.path / "records" / name);
  std::filesystem::create_directory(dir.path / "records" / "subdir");
  for (const char* name : {"99999999999999999999", "notes", "0", "007", "-5"})
    stray(dir.path / "leases" / name);

  const auto listed = plane.list("/dcr/");
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].key == "/dcr/receivers/r0");
  CHECK(listed[1].key == "/dcr/receivers/r1");
  CHECK(plane.list("").size() == 2);  // every prefix
  CHECK(plane.get("/dcr/receivers/r0")->value == "a");
  CHECK(plane.keep_alive(l));          // collects expired leases: reads leases/
  CHECK(dcr::put_if(plane, "/dcr/x", "y", 0));
  CHECK(plane.wait_for_change("/dcr/", 0, dcr::protocol_clock::now()) == revision0 + 1);
  const auto l2 = plane.grant_lease(60s);
  CHECK(l2 == l + 1);
  plane.revoke(l);                     // drop_lease reads records/
  CHECK_FALSE(plane.get("/dcr/receivers/r1").has_value());
  for (const char* name : {"%zz", "%2fdcr%2freceivers%2fr0", "notes+1", "x~", "%2Fdcr%2Freceivers%2F%",
                           "subdir", "99999999999999999999", "notes", "0", "007", "-5"}) {
    CAPTURE(std::string(name));
    CHECK(reported.contains(name));
  }
  CHECK(reports == 11);  // once each, however often they were seen
  CHECK(reported["subdir"] == "not a regular file");
  // The stray files are still there, untouched.
  CHECK(std::filesystem::exists(dir.path / "records" / "%zz"));
  CHECK(std::filesystem::exists(dir.path / "leases" / "99999999999999999999"));
}

TEST_CASE("file control plane: a damaged file of its own is a dcr::error naming the file") {
  temp_dir dir;
  dcr::file_control_plane::create(dir.path);
  dcr::file_control_plane plane(dir.path);
  dcr::put(plane, "/dcr/commit", "v0");
  const dcr::lease_id l = plane.grant_lease(60s);
  const auto expect_named = [](auto&& op, const std::filesystem::path& file) {
    CAPTURE(file);
    try {
      op();
      FAIL("no error");
    } catch (const dcr::error& e) {
      CAPTURE(e.what());
      CHECK(e.dcr_code() == dcr::errc::control_plane_unavailable);
      CHECK(std::string(e.what()).find(file.string()) != std::string::npos);
    } catch (const std::exception& e) {
      FAIL("not a dcr::error: " << e.what());
    }
  };
  const auto overwrite = [](const std::filesystem::path& p, const std::string& text) {
    std::ofstream(p, std::ios::trunc) << text;
  };
  const auto record = dir.path / "records" / "%2Fdcr%2Fcommit";
  const std::string good_record = [&] {
    std::ifstream in(record);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  overwrite(record, "dcrrec1 x 0 2 0000000000000000\nv0");
  expect_named([&] { (void)plane.get("/dcr/commit"); }, record);
  expect_named([&] { (void)plane.list("/dcr/"); }, record);
  overwrite(record, good_record);
  CHECK(plane.get("/dcr/commit")->value == "v0");

  const auto revision = dir.path / "revision";
  overwrite(revision, "99999999999999999999");
  expect_named([&] { (void)plane.revision(); }, revision);
  expect_named([&] { dcr::put(plane, "/dcr/x", "y"); }, revision);
  overwrite(revision, "abc");
  expect_named([&] { (void)plane.revision(); }, revision);
  overwrite(revision, "2");

  const auto next_lease = dir.path / "next-lease";
  overwrite(next_lease, "99999999999999999999");
  expect_named([&] { (void)plane.grant_lease(60s); }, next_lease);
  overwrite(next_lease, std::to_string(l));

  const auto lease = dir.path / "leases" / std::to_string(l);
  overwrite(lease, "soon");
  expect_named([&] { (void)plane.keep_alive(l); }, lease);
  overwrite(lease, "99999999999999999999 60");
  expect_named([&] { (void)plane.keep_alive(l); }, lease);
  overwrite(lease, "1 60");  // expired: the next renewal collects it
  CHECK_FALSE(plane.keep_alive(l));

  dcr::put(plane, "/dcr/y", "z");
  overwrite(dir.path / "journal", "dcrtxn1 9 1\n0 0 99999999999999999999 1\nk");
  expect_named([&] { (void)plane.get("/dcr/y"); }, dir.path / "journal");
}

// ---- the lease keeper

namespace {

// A control plane whose keep_alive throws what `thrower` throws, `throws` times, then reports
// the lease gone.
struct throwing_plane {
  using control_plane_concept = dcr::control_plane_tag;
  std::function<void()> thrower;
  int throws = 0;
  std::atomic<int> calls{0};
  std::optional<dcr::control_record> get(const std::string&) { return std::nullopt; }
  std::vector<dcr::control_record> list(const std::string&) { return {}; }
  bool transact(std::span<const dcr::key_compare>, std::span<const dcr::key_write>) { return true; }
  std::int64_t revision() { return 0; }
  std::int64_t wait_for_change(const std::string&, std::int64_t, dcr::protocol_clock::time_point) {
    return 0;
  }
  dcr::lease_id grant_lease(std::chrono::seconds) { return 1; }
  bool keep_alive(dcr::lease_id) {
    if (calls++ < throws) thrower();
    return false;
  }
  void revoke(dcr::lease_id) {}
};
static_assert(dcr::control_plane<throwing_plane>);

// Runs `body` in a child process and returns its exit status (an exception escaping a thread
// calls std::terminate: the child dies of SIGABRT instead of the whole test binary).
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 1;
    try {
      code = body();
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("lease_keeper: no exception of a renewal escapes its thread (never std::terminate)") {
  const std::vector<std::pair<const char*, std::function<void()>>> throwers = {
      {"std::out_of_range", [] { throw std::out_of_range("stoll"); }},
      {"std::runtime_error", [] { throw std::runtime_error("odd"); }},
      {"an int", [] { throw 7; }},
      {"control_plane_unavailable",
       [] { throw dcr::error(dcr::errc::control_plane_unavailable, "away"); }},
  };
  for (const auto& [what, thrower] : throwers) {
    CAPTURE(std::string(what));
    const int status = in_child([&, thrower = thrower] {
      throwing_plane plane;
      plane.thrower = thrower;
      plane.throws = 2;
      dcr::lease_keeper<throwing_plane> keeper(plane, 1, std::chrono::seconds(1));
      // Renewals every 333 ms, a retry 100 ms after a throw: the third call reports the lease
      // gone.
      for (int i = 0; i < 100 && keeper.alive(); ++i) std::this_thread::sleep_for(20ms);
      return !keeper.alive() && plane.calls.load() >= 3 ? 0 : 3;
    });
    CHECK(status == 0);
  }
}

TEST_CASE("lease_keeper over a file plane with a stray lease file keeps the lease alive") {
  temp_dir dir;
  dcr::file_control_plane::create(dir.path);
  std::ofstream(dir.path / "leases" / "99999999999999999999") << "1 1\n";
  const int status = in_child([&] {
    dcr::file_control_plane plane(dir.path);
    plane.set_foreign_file_sink({});
    const auto l = plane.grant_lease(std::chrono::seconds(1));
    dcr::put(plane, "/dcr/receivers/r0", "alive", l);
    {
      dcr::lease_keeper<dcr::file_control_plane> keeper(plane, l, std::chrono::seconds(1));
      std::this_thread::sleep_for(1500ms);  // past the ttl: only renewals kept it
      if (!keeper.alive()) return 3;
    }
    return plane.get("/dcr/receivers/r0").has_value() ? 0 : 4;
  });
  CHECK(status == 0);
}
