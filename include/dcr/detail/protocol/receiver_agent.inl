// dcr/detail/protocol/receiver_agent.inl: the bodies of dcr/protocol/receiver_agent.hpp (included
// at its end).
#pragma once

namespace dcr {

template <control_plane Plane, payload_source Source>
receiver_agent<Plane, Source>::~receiver_agent() {
  keeper_.reset();
  if (lease_ != 0) {
    try {
      plane_->revoke(lease_);
    } catch (const error&) {
    }
  }
}

template <control_plane Plane, payload_source Source>
void receiver_agent<Plane, Source>::start(std::uint64_t committed_version, bool restored,
                                          protocol_clock::time_point deadline) {
  rx_->end_transition(committed_version);  // what the storage holds (or, unrestored, last held)
  restored_ = restored;
  with_retry("receiver agent: register", deadline, [&] {
    lease_ = plane_->grant_lease(options_.lease_ttl);
    register_self();
    return 0;
  });
  keeper_ = std::make_unique<lease_keeper<Plane>>(*plane_, lease_, options_.lease_ttl);
}

template <control_plane Plane, payload_source Source>
std::uint64_t receiver_agent<Plane, Source>::serve_until(std::uint64_t version,
                                                         protocol_clock::time_point deadline,
                                                         const std::atomic<bool>* stop) {
  DCR_EXPECTS(lease_ != 0, errc::not_ready, "receiver agent: serve before start");
  const auto& keys = options_.keys;
  stop_ = stop;
  for (;;) {
    DCR_EXPECTS(stop == nullptr || !stop->load(), errc::not_ready, "receiver agent: stopped");
    if (!keeper_->alive()) {  // the lease expired (an outage longer than its ttl): it comes
      keeper_.reset();        // back as a new incarnation (restored if its storage is clean)
      incarnation_ = make_incarnation();
      with_retry("receiver agent: re-register", deadline, [&] {
        lease_ = plane_->grant_lease(options_.lease_ttl);
        register_self();
        return 0;
      });
      keeper_ = std::make_unique<lease_keeper<Plane>>(*plane_, lease_, options_.lease_ttl);
    }
    const std::int64_t seen =
        with_retry("receiver agent: revision", deadline, [&] { return plane_->revision(); });
    const auto commit = with_retry("receiver agent: read commit", deadline, [&] {
      return read_record<commit_record>(*plane_, keys.commit());
    });
    if (commit && restored_ && applied_ && commit->value.version == committed_version() + 1 &&
        commit->value.attempt == applied_key_.number) {
      // The transition this receiver applied was committed.
      rx_->end_transition(commit->value.version);
      applied_ = false;
      dirty_ = false;
      with_retry("receiver agent: update registration", deadline, [&] {
        register_self();
        return 0;
      });
      if (gate_closed_ && gate_.open) gate_.open();
      gate_closed_ = false;
    }
    const std::uint64_t held = committed_version();
    if (commit && held >= version && restored_ && commit->value.version == held) return held;
    const auto attempt = with_retry("receiver agent: read attempt", deadline, [&] {
      return read_record<attempt_record>(*plane_, keys.attempt());
    });
    if (attempt && attempt->value.state == attempt_state::open &&
        std::find(attempt->value.receivers.begin(), attempt->value.receivers.end(), name_) !=
            attempt->value.receivers.end() &&
        !acked(attempt->value.key)) {
      const auto& a = attempt->value;
      const bool restore = a.kind == attempt_kind::restore;
      if ((restore && a.key.base_version >= held) ||
          (!restore && restored_ && a.key.base_version == held)) {
        run_attempt(a, attempt->revision, deadline);
        continue;
      }
    }
    if (attempt && attempt->value.state == attempt_state::fenced &&
        std::find(attempt->value.receivers.begin(), attempt->value.receivers.end(), name_) !=
            attempt->value.receivers.end() &&
        !acked(attempt->value.key)) {
      // Fenced before this receiver started it: nothing of it was written here; say so, so
      // that the coordinator need not wait for this receiver's lease to expire.
      acked_.push_back(attempt->value.key);
      receiver_ack fenced_ack;
      fenced_ack.name = name_;
      fenced_ack.incarnation = incarnation_;
      fenced_ack.state = ack_state::fenced;
      with_retry("receiver agent: acknowledge fence", deadline, [&] {
        put(*plane_, keys.ack(attempt->value.key, name_), encode_record(fenced_ack));
        return 0;
      });
      continue;
    }
    DCR_EXPECTS(protocol_clock::now() < deadline, errc::deadline_exceeded,
                "receiver '" + name_ + "': version " + std::to_string(version) +
                    " not reached by the deadline (holds " + std::to_string(held) + ")");
    with_retry("receiver agent: wait", deadline, [&] {
      return plane_->wait_for_change(
          keys.all(), seen, std::min(deadline, protocol_clock::now() + std::chrono::seconds(1)));
    });
  }
}

template <control_plane Plane, payload_source Source>
void receiver_agent<Plane, Source>::register_self() {
  receiver_registration reg;
  reg.name = name_;
  reg.incarnation = incarnation_;
  const auto only = rx_->overwrite_only_tensors();
  reg.overwrite_only.assign(only.begin(), only.end());
  reg.committed_version = committed_version();
  reg.restored = restored_ && !dirty_;
  reg.registry_fingerprint = fingerprint_;
  put(*plane_, options_.keys.receiver(name_), encode_record(reg), lease_);
}

template <control_plane Plane, payload_source Source>
bool receiver_agent<Plane, Source>::acked(const attempt_key& key) const {
  return std::find(acked_.begin(), acked_.end(), key) != acked_.end();
}

template <control_plane Plane, payload_source Source>
void receiver_agent<Plane, Source>::apply_one(delivery& d) {
  const double a0 = unix_seconds_now();
  struct span_guard {
    std::vector<stage_span>* out;
    double begin;
    ~span_guard() { out->push_back({"apply", begin, unix_seconds_now()}); }
  } guard{&timeline_, a0};
  try {
    rx_->apply_payload(d.bytes);
  } catch (const error& e) {
    if (e.dcr_code() == errc::stale_payload) {
      ++ack_.stale;
      ++stale_total_;
      return;
    }
    if (!source_->refetch(d.id, d.bytes)) throw;
    ++ack_.refetched;
    rx_->apply_payload(d.bytes);  // a second failure fails the attempt
  }
  ++applied_count_;
  if (options_.after_apply) options_.after_apply(current_, applied_count_);
}

// Watches the attempt record from a thread of its own: fenced() once the record left `open`
// (or was replaced), which stops the apply between payloads. One control-plane wait per
// protocol change, never per payload. It watches the whole protocol prefix, so that the
// receiver's own acknowledgement wakes it and it stops as soon as the attempt is over here
// (never a poll interval later). finish() tells it to stop; the destructor joins it.
template <control_plane Plane, payload_source Source>
class receiver_agent<Plane, Source>::fence_watcher {
 public:
  fence_watcher(Plane& plane, const protocol_keys& keys, std::int64_t attempt_revision)
      : thread_([this, &plane, &keys, attempt_revision] {
          std::int64_t rev = attempt_revision;
          while (!done_.load()) {
            try {
              rev = plane.wait_for_change(keys.all(), rev,
                                          clock::now() + std::chrono::milliseconds(500));
              if (done_.load()) return;
              auto r = plane.get(keys.attempt());
              if (!r || r->revision != attempt_revision) {
                fenced_ = true;
                return;
              }
            } catch (const error&) {
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
          }
        }) {}
  fence_watcher(const fence_watcher&) = delete;
  fence_watcher& operator=(const fence_watcher&) = delete;
  ~fence_watcher() {
    finish();
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] const std::atomic<bool>& fenced() const noexcept { return fenced_; }
  void finish() noexcept { done_ = true; }

 private:
  std::atomic<bool> fenced_{false}, done_{false};
  std::thread thread_;  // last: started once the flags exist
};

template <control_plane Plane, payload_source Source>
void receiver_agent<Plane, Source>::run_attempt(const attempt_record& a,
                                                std::int64_t attempt_revision,
                                                protocol_clock::time_point deadline) {
  begin_ack(a);
  const auto t0 = clock::now();
  const bool restore = a.kind == attempt_kind::restore;
  const auto attempt_deadline =
      std::min(deadline, clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(
                                            0, a.deadline_unix_ms - unix_ms_now())));
  // Stopped however this function is left; normally the acknowledgement written at the end
  // has already woken it.
  fence_watcher watcher(*plane_, options_.keys, attempt_revision);
  rx_->begin_attempt(a.key);
  source_->open(a.key, a.owners);
  if (!restore) dirty_ = true;
  double fetch = 0;
  const std::string failure = deliver(a, attempt_deadline, watcher.fenced(), fetch);
  watcher.finish();
  // Nothing more of this attempt is taken here, whatever happened: a push transport answers
  // its senders for whatever this receiver did not take.
  if constexpr (closable_source<Source>) source_->close(a.key);
  settle_ack(a, failure, watcher.fenced().load(), t0, fetch);
  acknowledge(a, deadline);
}

template <control_plane Plane, payload_source Source>
void receiver_agent<Plane, Source>::begin_ack(const attempt_record& a) {
  acked_.push_back(a.key);
  current_ = a;
  applied_count_ = 0;
  timeline_.clear();
  ack_ = {};
  ack_.name = name_;
  ack_.incarnation = incarnation_;
}

template <control_plane Plane, payload_source Source>
std::string receiver_agent<Plane, Source>::deliver(const attempt_record& a,
                                                   protocol_clock::time_point attempt_deadline,
                                                   const std::atomic<bool>& fenced,
                                                   double& fetch_seconds) {
  const bool restore = a.kind == attempt_kind::restore;
  try {
    if (!restore && !options_.asynchronous && !gate_closed_) close_gate();
    pipeline_stage<delivery> stage(options_.queue_depth, [&](delivery& d) { apply_one(d); });
    std::vector<delivery> staged;  // asynchronous mode: compressed payloads in host memory
    for (;;) {
      if (stop_ != nullptr && stop_->load())
        throw error(errc::not_ready, "receiver agent: stopped");
      if (fenced.load()) break;
      delivery d;
      const auto f0 = clock::now();
      const auto status = source_->next(
          d, std::min(attempt_deadline, clock::now() + std::chrono::milliseconds(100)));
      fetch_seconds += seconds(clock::now() - f0);
      if (status == source_status::complete) break;
      if (status == source_status::timed_out) {
        DCR_EXPECTS(clock::now() < attempt_deadline, errc::deadline_exceeded,
                    "receiver '" + name_ + "': attempt " + to_string(a.key) +
                        " not delivered by its deadline");
        continue;
      }
      ++ack_.payloads;
      ack_.payload_bytes += d.bytes.size();
      if (options_.asynchronous && !restore)
        staged.push_back(std::move(d));
      else
        stage.submit(std::move(d));
    }
    if (options_.asynchronous && !restore && !fenced.load()) {
      close_gate();  // every payload is here: the engine pauses only for the apply
      for (auto& d : staged) {
        if (fenced.load()) break;
        stage.submit(std::move(d));
      }
    }
    stage.drain();
    ack_.apply_seconds = stage.busy_seconds();
  } catch (const error& e) {
    return std::string("receiver '") + name_ + "': " + e.what();
  }
  return {};
}

template <control_plane Plane, payload_source Source>
void receiver_agent<Plane, Source>::settle_ack(const attempt_record& a, const std::string& failure,
                                               bool fenced, clock::time_point t0, double fetch) {
  const bool restore = a.kind == attempt_kind::restore;
  ack_.duplicates = rx_->stats().duplicates_dropped;
  ack_.applied_payloads = rx_->stats().attempt_payloads;
  ack_.applied_payload_digest = rx_->stats().attempt_payload_digest;
  ack_.fetch_seconds = fetch;
  ack_.seconds = seconds(clock::now() - t0);
  ack_.peak_rss_bytes = peak_rss_bytes();
  if (!failure.empty()) {
    ack_.state = ack_state::failed;
    ack_.failure = failure;
  } else if (fenced) {
    ack_.state = ack_state::fenced;
  } else {
    ack_.state = restore ? ack_state::restored : ack_state::applied;
  }
  if (restore && ack_.state == ack_state::restored) {
    restored_ = true;
    dirty_ = false;
    ++restores_;
    rx_->end_transition(a.key.base_version);  // the storage holds v now
  }
  if (!restore && ack_.state == ack_state::applied) {
    applied_ = true;
    applied_key_ = a.key;
  }
}

template <control_plane Plane, payload_source Source>
void receiver_agent<Plane, Source>::acknowledge(const attempt_record& a,
                                                protocol_clock::time_point deadline) {
  const bool restore = a.kind == attempt_kind::restore;
  with_retry("receiver agent: acknowledge", deadline, [&] {
    if (restore) register_self();  // restored first: the coordinator reads the ack after it
    put(*plane_, options_.keys.ack(a.key, name_), encode_record(ack_));
    return 0;
  });
}

template <control_plane Plane, payload_source Source>
void receiver_agent<Plane, Source>::close_gate() {
  if (gate_closed_) return;
  if (gate_.close) gate_.close();
  gate_closed_ = true;
}

}  // namespace dcr
