// Control planes: the laws every implementation keeps (control_plane_laws.hpp), run against the
// memory and file stores, plus what only the file store must survive: a process killed in the
// middle of a transaction, a vanished directory.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "control_plane_laws.hpp"
#include "dcr/protocol/file_control_plane.hpp"
#include "dcr/protocol/memory_control_plane.hpp"

namespace {

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/dcr-cp-XXXXXX";
    path = ::mkdtemp(tmpl);
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
