// python/src/protocol.cpp: control planes, payload stores, and the three agents (owner agent,
// coordinator, receiver agent) driven from Python. Every blocking call releases the GIL; the
// receiver agent can run on its own thread with the request gate as Python callbacks.
//
// The agents are templates over (control plane, payload store); the binding instantiates the
// embedded default (file plane + file store), the in-memory pair (tests, one process) and, where
// libcurl and libcrypto were found (DCR_PY_NET), the cluster pair (etcd plane + S3 store), and
// hides the choice behind one Python class per agent.
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/plane/file_control_plane.hpp"
#include "dcr/protocol/plane/memory_control_plane.hpp"
#include "dcr/protocol/owner_agent.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/payload_store.hpp"
#include "dcr/protocol/receiver_agent.hpp"
#if __has_include(<curl/curl.h>) && __has_include(<openssl/sha.h>)
#define DCR_PY_NET 1
#else
#define DCR_PY_NET 0
#endif
#if DCR_PY_NET
#include "dcr/protocol/plane/etcd_control_plane.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"
#endif
#include "owner.hpp"
#include "receiver.hpp"

namespace dcr_py {
namespace {

using clock = dcr::protocol_clock;

clock::time_point deadline_in(double seconds) {
  DCR_EXPECTS(seconds > 0, dcr::errc::invalid_argument, "timeout must be positive");
  return clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
}

nb::object json_value(const nlohmann::json& j) {
  return nb::module_::import_("json").attr("loads")(j.dump());
}

// A file control plane that exists: create() then open.
struct file_plane : dcr::file_control_plane {
  file_plane(const std::string& dir, bool create) : dcr::file_control_plane(prepared(dir, create)) {}
  static std::string prepared(const std::string& dir, bool create) {
    if (create) dcr::file_control_plane::create(dir);
    return dir;
  }
};

// ---- owner agent

struct owner_agent_iface {
  virtual ~owner_agent_iface() = default;
  virtual void start(std::uint64_t version, clock::time_point deadline, bool restarted) = 0;
  virtual nlohmann::json serve(const std::string& candidate, std::span<const std::span<const std::byte>> s,
                               std::span<const std::span<const std::byte>> in, clock::time_point deadline) = 0;
};

template <class Plane, class Store>
struct owner_agent_impl final : owner_agent_iface {
  owner_agent_impl(py_owner& o, Plane& plane, Store& store, dcr::owner_agent_options opts)
      : agent(o.get(), o.registry(), plane, store, std::move(opts)) {}
  void start(std::uint64_t version, clock::time_point deadline, bool restarted) override {
    agent.start(version, deadline, restarted);
  }
  nlohmann::json serve(const std::string& candidate, std::span<const std::span<const std::byte>> s,
                       std::span<const std::span<const std::byte>> in, clock::time_point deadline) override {
    agent.serve_transition(candidate, s, in, deadline);
    return nlohmann::json(agent.last_report());
  }
  dcr::owner_agent<Plane, Store> agent;
};

struct py_owner_agent {
  py_owner* owner = nullptr;
  std::unique_ptr<owner_agent_iface> impl;
};

dcr::owner_agent_options owner_options(std::size_t bucket_bytes, std::size_t chunk_bytes, bool pipelined,
                                       int lease_ttl, std::size_t build_threads) {
  dcr::owner_agent_options o;
  o.bucket_bytes = bucket_bytes;
  o.chunk_bytes = chunk_bytes;
  o.pipelined = pipelined;
  o.lease_ttl = std::chrono::seconds(lease_ttl);
  o.build_threads = build_threads;
  return o;
}

template <class Plane, class Store>
void def_owner_agent_init(nb::class_<py_owner_agent>& c) {
  c.def("__init__",
        [](py_owner_agent* self, py_owner& o, Plane& plane, Store& store, std::size_t bucket_bytes,
           std::size_t chunk_bytes, bool pipelined, int lease_ttl, std::size_t build_threads) {
          new (self) py_owner_agent{
              &o, std::make_unique<owner_agent_impl<Plane, Store>>(
                      o, plane, store,
                      owner_options(bucket_bytes, chunk_bytes, pipelined, lease_ttl, build_threads))};
        },
        nb::arg("owner"), nb::arg("plane"), nb::arg("store"), nb::arg("bucket_bytes") = std::size_t{64} << 20,
        nb::arg("chunk_bytes") = std::size_t{64} << 20, nb::arg("pipelined") = true, nb::arg("lease_ttl") = 10,
        nb::arg("build_threads") = std::size_t{1},
        nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>());
}

// ---- coordinator

struct coordinator_iface {
  virtual ~coordinator_iface() = default;
  virtual void initialize(std::uint64_t version, clock::time_point deadline) = 0;
  virtual dcr::transition_summary run(const std::string& candidate, clock::time_point deadline) = 0;
};

template <class Plane, class Store>
struct coordinator_impl final : coordinator_iface {
  coordinator_impl(Plane& plane, Store& store, std::uint64_t fp, std::vector<std::uint32_t> owners,
                   dcr::coordinator_options o)
      : c(plane, store, fp, std::move(owners), std::move(o)) {}
  void initialize(std::uint64_t version, clock::time_point deadline) override { c.initialize(version, deadline); }
  dcr::transition_summary run(const std::string& candidate, clock::time_point deadline) override {
    return c.run_transition(candidate, deadline);
  }
  dcr::coordinator<Plane, Store> c;
};

struct py_coordinator {
  std::unique_ptr<coordinator_iface> impl;
};

nb::dict summary_dict(const dcr::transition_summary& s) {
  nb::dict d;
  d["base_version"] = s.base_version;
  d["target_version"] = s.target_version;
  d["committed"] = s.committed;
  d["committed_by_other"] = s.committed_by_other;
  d["restores"] = s.restores;
  d["seconds"] = s.seconds;
  d["wait_seconds"] = s.wait_seconds;
  nb::list attempts;
  for (const auto& a : s.attempts) {
    nb::dict x;
    x["attempt"] = a.key.number;
    x["kind"] = json_value(nlohmann::json(a.kind));
    x["policy"] = json_value(nlohmann::json(a.policy));
    x["committed"] = a.committed;
    x["failure"] = a.failure;
    x["seconds"] = a.seconds;
    x["reports"] = json_value(nlohmann::json(a.reports));
    x["acks"] = json_value(nlohmann::json(a.acks));
    attempts.append(x);
  }
  d["attempts"] = attempts;
  return d;
}

template <class Plane, class Store>
void def_coordinator_init(nb::class_<py_coordinator>& c) {
  c.def("__init__",
        [](py_coordinator* self, Plane& plane, Store& store, const dcr::tensor_registry& registry,
           const std::vector<std::uint32_t>& owners, const std::string& policy, std::uint32_t max_attempts,
           double attempt_timeout, std::size_t min_receivers) {
          dcr::coordinator_options o;
          o.policy = policy_from_name(policy);
          o.max_attempts = max_attempts;
          o.attempt_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(attempt_timeout * 1000));
          o.min_receivers = min_receivers;
          new (self) py_coordinator{std::make_unique<coordinator_impl<Plane, Store>>(
              plane, store, registry.fingerprint(), owners, std::move(o))};
        },
        nb::arg("plane"), nb::arg("store"), nb::arg("registry"), nb::arg("owners"), nb::arg("policy") = "mixed",
        nb::arg("max_attempts") = 5, nb::arg("attempt_timeout") = 120.0, nb::arg("min_receivers") = 0,
        nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>());
}

// ---- receiver agent

struct receiver_agent_iface {
  virtual ~receiver_agent_iface() = default;
  virtual void start(std::uint64_t version, bool restored, clock::time_point deadline) = 0;
  virtual std::uint64_t serve_until(std::uint64_t version, clock::time_point deadline,
                                    const std::atomic<bool>* stop) = 0;
  virtual std::uint64_t committed() const = 0;
  virtual nlohmann::json last_ack() const = 0;
  virtual std::uint64_t restores() const = 0;
  virtual std::uint64_t stale_refused() const = 0;
};

template <class Plane, class Store>
struct receiver_agent_impl final : receiver_agent_iface {
  receiver_agent_impl(const std::string& name, py_receiver& r, Plane& plane, Store& store,
                      dcr::receiver_agent_options o, dcr::request_gate gate)
      : source(store), agent(name, r.rx, r.registry->fingerprint(), plane, source, std::move(o), std::move(gate)) {}
  void start(std::uint64_t version, bool restored, clock::time_point deadline) override {
    agent.start(version, restored, deadline);
  }
  std::uint64_t serve_until(std::uint64_t version, clock::time_point deadline,
                            const std::atomic<bool>* stop) override {
    return agent.serve_until(version, deadline, stop);
  }
  std::uint64_t committed() const override { return agent.committed_version(); }
  nlohmann::json last_ack() const override { return nlohmann::json(agent.last_ack()); }
  std::uint64_t restores() const override { return agent.restores(); }
  std::uint64_t stale_refused() const override { return agent.stale_refused(); }
  dcr::store_source<Store> source;
  dcr::receiver_agent<Plane, dcr::store_source<Store>> agent;
};

// A gate callback: the Python callable, with the GIL taken; a Python exception becomes a
// dcr::error so that the agent fails the attempt with the callback's message.
std::function<void()> gate_callback(nb::object fn, const char* which) {
  if (fn.is_none()) return {};
  auto shared = std::shared_ptr<nb::object>(new nb::object(std::move(fn)), [](nb::object* o) {
    nb::gil_scoped_acquire gil;
    delete o;
  });
  return [shared, which] {
    nb::gil_scoped_acquire gil;
    try {
      (*shared)();
    } catch (nb::python_error& e) {
      const std::string what = python_error_text(e);
      throw dcr::error(dcr::errc::invalid_argument, std::string("request gate ") + which + " raised " + what);
    }
  };
}

class py_receiver_agent {
 public:
  std::unique_ptr<receiver_agent_iface> impl;
  std::atomic<std::uint64_t> committed{0};

  ~py_receiver_agent() { stop_thread(); }

  void start_thread() {
    DCR_EXPECTS(!thread_.joinable(), dcr::errc::not_ready, "ReceiverAgent: its thread already runs");
    stop_ = false;
    failure_ = nullptr;
    committed = impl->committed();
    thread_ = std::thread([this] {
      try {
        for (;;) {
          // One transition at a time; the deadline only bounds an idle wait, the loop goes on.
          const auto v = impl->serve_until(committed.load() + 1, clock::now() + std::chrono::hours(24), &stop_);
          committed = v;
        }
      } catch (...) {
        if (!stop_) {
          std::lock_guard lock(mutex_);
          failure_ = std::current_exception();
        }
      }
    });
  }

  void stop_thread() {
    stop_ = true;
    if (thread_.joinable()) {
      nb::gil_scoped_release release;  // the thread may be waiting for the GIL (gate callbacks)
      thread_.join();
    }
  }

  /// Rethrows what ended the thread, if anything did.
  void check() {
    std::exception_ptr f;
    {
      std::lock_guard lock(mutex_);
      f = failure_;
    }
    if (f) std::rethrow_exception(f);
  }

  bool running() const { return thread_.joinable(); }

 private:
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::exception_ptr failure_;
};

template <class Plane, class Store>
void def_receiver_agent_init(nb::class_<py_receiver_agent>& c) {
  c.def("__init__",
        [](py_receiver_agent* self, const std::string& name, py_receiver& r, Plane& plane, Store& store,
           nb::object gate_close, nb::object gate_open, bool asynchronous, int lease_ttl) {
          dcr::receiver_agent_options o;
          o.asynchronous = asynchronous;
          o.lease_ttl = std::chrono::seconds(lease_ttl);
          dcr::request_gate gate{gate_callback(std::move(gate_close), "close"),
                                 gate_callback(std::move(gate_open), "open")};
          new (self) py_receiver_agent();
          self->impl = std::make_unique<receiver_agent_impl<Plane, Store>>(name, r, plane, store, std::move(o),
                                                                           std::move(gate));
        },
        nb::arg("name"), nb::arg("receiver"), nb::arg("plane"), nb::arg("store"),
        nb::arg("gate_close") = nb::none(), nb::arg("gate_open") = nb::none(), nb::arg("asynchronous") = false,
        nb::arg("lease_ttl") = 10, nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>(), nb::keep_alive<1, 5>());
}

}  // namespace

void bind_protocol(nb::module_& m) {
  nb::class_<file_plane>(m, "FileControlPlane",
      "The embedded control plane: a local or shared directory (lock + fsync + atomic rename).")
      .def(nb::init<const std::string&, bool>(), nb::arg("path"), nb::arg("create") = true);
  nb::class_<dcr::memory_control_plane>(m, "MemoryControlPlane", "An in-memory control plane (one process).")
      .def(nb::init<>());
  nb::class_<dcr::file_payload_store>(m, "FilePayloadStore",
      "Payloads as files in a local or shared directory (atomic temp + rename).")
      .def("__init__", [](dcr::file_payload_store* self, const std::string& dir) { new (self) dcr::file_payload_store(dir); },
           nb::arg("path"))
      .def("erase_through", &dcr::file_payload_store::erase_through, nb::arg("version"));
  nb::class_<dcr::memory_payload_store>(m, "MemoryPayloadStore", "An in-memory payload store (one process).")
      .def(nb::init<>())
      .def_prop_ro("bytes_put", &dcr::memory_payload_store::bytes_put)
      .def_prop_ro("object_count", &dcr::memory_payload_store::object_count);

#if DCR_PY_NET
  nb::class_<dcr::etcd_control_plane>(m, "EtcdControlPlane",
      "The etcd v3 control plane: EtcdControlPlane(endpoint, key_prefix='/dcr'), endpoint an "
      "http(s) URL of one member's client port (e.g. http://127.0.0.1:2379).")
      .def("__init__",
           [](dcr::etcd_control_plane* self, const std::string& endpoint, const std::string& key_prefix) {
             dcr::etcd_options o;
             o.key_prefix = key_prefix;
             new (self) dcr::etcd_control_plane(endpoint, o);
           },
           nb::arg("endpoint"), nb::arg("key_prefix") = "/dcr");
  nb::class_<dcr::s3_payload_store>(m, "S3PayloadStore",
      "An S3 payload store: S3PayloadStore('s3://BUCKET/PREFIX/', endpoint=''), credentials and "
      "region from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION); an "
      "endpoint (e.g. SeaweedFS at http://127.0.0.1:PORT) selects path-style addressing.")
      .def("__init__",
           [](dcr::s3_payload_store* self, const std::string& url, const std::string& endpoint) {
             new (self) dcr::s3_payload_store(dcr::s3_options::from_environment(url, endpoint));
           },
           nb::arg("url"), nb::arg("endpoint") = "");
#endif
  nb::class_<py_owner_agent> oa(m, "OwnerAgent",
      "The trainer side of the protocol for one owner: follows the attempt records, builds and "
      "puts the payloads of every attempt, reports, and updates the trackers after the commit.");
  def_owner_agent_init<file_plane, dcr::file_payload_store>(oa);
  def_owner_agent_init<dcr::memory_control_plane, dcr::memory_payload_store>(oa);
#if DCR_PY_NET
  def_owner_agent_init<dcr::etcd_control_plane, dcr::s3_payload_store>(oa);
#endif
  oa.def("start",
         [](py_owner_agent& a, std::uint64_t version, double timeout, bool restarted) {
           const auto d = deadline_in(timeout);
           nb::gil_scoped_release release;
           a.impl->start(version, d, restarted);
         },
         nb::arg("version") = 0, nb::arg("timeout") = 60.0, nb::arg("restarted") = false,
         "Registers the owner (initialize() it first) with trackers at `version`.")
      .def("serve",
           [](py_owner_agent& a, const std::string& candidate, const std::vector<tensor_arg>& shards,
              const std::vector<tensor_arg>& inputs, double timeout) {
             std::vector<std::span<const std::byte>> s, in;
             a.owner->spans(shards, inputs, s, in, "OwnerAgent.serve");
             const auto d = deadline_in(timeout);
             nlohmann::json report;
             {
               nb::gil_scoped_release release;
               report = a.impl->serve(candidate, s, in, d);
             }
             return json_value(report);
           },
           nb::arg("candidate"), nb::arg("shards"), nb::arg("residual_inputs") = std::vector<tensor_arg>{},
           nb::arg("timeout") = 600.0,
           "One call per optimizer step: serves the transition to the next version for `candidate` "
           "(detect, build, publish; retries) until the coordinator commits it, then updates the "
           "trackers. Returns the owner's report of its last attempt. The GIL is released.");

  nb::class_<py_coordinator> co(m, "Coordinator",
      "Opens attempts, watches reports and acknowledgements, commits jointly, fences and retries.");
  def_coordinator_init<file_plane, dcr::file_payload_store>(co);
  def_coordinator_init<dcr::memory_control_plane, dcr::memory_payload_store>(co);
#if DCR_PY_NET
  def_coordinator_init<dcr::etcd_control_plane, dcr::s3_payload_store>(co);
#endif
  co.def("initialize",
         [](py_coordinator& c, std::uint64_t version, double timeout) {
           const auto d = deadline_in(timeout);
           nb::gil_scoped_release release;
           c.impl->initialize(version, d);
         },
         nb::arg("version") = 0, nb::arg("timeout") = 60.0,
         "Creates the commit record at `version` on a first start; RegistryMismatch for another model's.")
      .def("run_transition",
           [](py_coordinator& c, const std::string& candidate, double timeout) {
             const auto d = deadline_in(timeout);
             dcr::transition_summary s;
             {
               nb::gil_scoped_release release;
               s = c.impl->run(candidate, d);
             }
             return summary_dict(s);
           },
           nb::arg("candidate"), nb::arg("timeout") = 600.0,
           "Runs the transition from the committed version to the next for `candidate`. The GIL is released.");

  nb::class_<py_receiver_agent> ra(m, "ReceiverAgent",
      "The engine side of the protocol for one receiver: registration, dense restore when "
      "joining, fencing, apply, acknowledgement, and the request gate (Python callbacks).");
  def_receiver_agent_init<file_plane, dcr::file_payload_store>(ra);
  def_receiver_agent_init<dcr::memory_control_plane, dcr::memory_payload_store>(ra);
#if DCR_PY_NET
  def_receiver_agent_init<dcr::etcd_control_plane, dcr::s3_payload_store>(ra);
#endif
  ra.def("start",
         [](py_receiver_agent& a, std::uint64_t version, bool restored, double timeout) {
           const auto d = deadline_in(timeout);
           nb::gil_scoped_release release;
           a.impl->start(version, restored, d);
           a.committed = a.impl->committed();
         },
         nb::arg("version") = 0, nb::arg("restored") = true, nb::arg("timeout") = 60.0,
         "Registers; `restored`: the storage already holds `version` (a dense load).")
      .def("serve_until",
           [](py_receiver_agent& a, std::uint64_t version, double timeout) {
             DCR_EXPECTS(!a.running(), dcr::errc::not_ready, "ReceiverAgent.serve_until: its thread runs");
             const auto d = deadline_in(timeout);
             std::uint64_t v;
             {
               nb::gil_scoped_release release;
               v = a.impl->serve_until(version, d, nullptr);
             }
             a.committed = v;
             return v;
           },
           nb::arg("version"), nb::arg("timeout") = 600.0,
           "Serves attempts on the calling thread until `version` is committed and held.")
      .def("start_thread", &py_receiver_agent::start_thread,
           "Serves every transition on a thread of its own until stop().")
      .def("stop",
           [](py_receiver_agent& a) {
             a.stop_thread();
             a.check();
           },
           "Stops the thread (between payloads) and raises what ended it, if anything did.")
      .def("wait_for",
           [](py_receiver_agent& a, std::uint64_t version, double timeout) {
             const auto d = deadline_in(timeout);
             for (;;) {
               a.check();
               if (a.committed.load() >= version) return a.committed.load();
               DCR_EXPECTS(clock::now() < d, dcr::errc::deadline_exceeded,
                           "ReceiverAgent.wait_for: version " + std::to_string(version) + " not held in time");
               nb::gil_scoped_release release;
               std::this_thread::sleep_for(std::chrono::milliseconds(1));
             }
           },
           nb::arg("version"), nb::arg("timeout") = 600.0,
           "Waits until the agent's thread holds `version`; raises what ended the thread.")
      .def_prop_ro("committed_version", [](py_receiver_agent& a) { return a.committed.load(); })
      .def_prop_ro("last_ack", [](py_receiver_agent& a) { return json_value(a.impl->last_ack()); })
      .def_prop_ro("restores", [](py_receiver_agent& a) { return a.impl->restores(); })
      .def_prop_ro("stale_refused", [](py_receiver_agent& a) { return a.impl->stale_refused(); });
}

}  // namespace dcr_py
