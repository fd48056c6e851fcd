// dcr/detail/protocol/coordinator.inl: the bodies of dcr/protocol/coordinator.hpp (included at its
// end).
#pragma once

namespace dcr {

template <control_plane Plane, payload_cleanup Store>
coordinator<Plane, Store>::coordinator(Plane& plane, Store& store,
                                       std::uint64_t registry_fingerprint,
                                       std::vector<std::uint32_t> owners,
                                       coordinator_options options)
    : plane_(&plane),
      store_(&store),
      fingerprint_(registry_fingerprint),
      owners_(std::move(owners)),
      options_(std::move(options)) {
  std::sort(owners_.begin(), owners_.end());
}

template <control_plane Plane, payload_cleanup Store>
void coordinator<Plane, Store>::initialize(std::uint64_t version,
                                           protocol_clock::time_point deadline) {
  const auto& keys = options_.keys;
  with_retry("coordinator: initialize", deadline, [&] {
    commit_record c;
    c.version = version;
    c.registry_fingerprint = fingerprint_;
    put_if(*plane_, keys.commit(), encode_record(c), 0);
    put_if(*plane_, keys.membership(), encode_record(membership_record{}), 0);
    return 0;
  });
  const auto c = with_retry("coordinator: read commit", deadline,
                            [&] { return read_record<commit_record>(*plane_, keys.commit()); });
  DCR_EXPECTS(c && c->value.registry_fingerprint == fingerprint_, errc::registry_mismatch,
              "coordinator: the commit record under '" + keys.commit() +
                  "' belongs to another model (registry fingerprint differs)");
}

template <control_plane Plane, payload_cleanup Store>
transition_summary coordinator<Plane, Store>::run_transition(const std::string& candidate,
                                                             protocol_clock::time_point deadline) {
  const auto& keys = options_.keys;
  const auto t0 = protocol_clock::now();
  std::optional<protocol_clock::time_point> opened;  // the first attempt record written
  std::optional<protocol_clock::time_point> committed_at;
  transition_summary out;
  auto commit = must_read<commit_record>(keys.commit(), deadline);
  const std::uint64_t v = commit.value.version;
  out.base_version = v;
  out.target_version = v + 1;
  std::uint32_t refit_attempts = 0;
  for (;;) {
    auto current = with_retry("coordinator: read attempt", deadline,
                              [&] { return read_record<attempt_record>(*plane_, keys.attempt()); });
    std::optional<typed_record<attempt_record>> open;
    if (current && current->value.state == attempt_state::open &&
        current->value.key.base_version == v &&
        (current->value.kind == attempt_kind::restore || current->value.candidate == candidate)) {
      open = current;  // continue what a predecessor (or a racing coordinator) prepared
    } else if (current && current->value.state == attempt_state::open) {
      fence(*current, deadline);  // another transition's or candidate's leftover
      continue;
    } else {
      if (refit_attempts >= options_.max_attempts) break;
      open = prepare(v, candidate, current, deadline, out);
      if (!open) continue;  // lost a race on the attempt record, or a restore ran
    }
    const bool restore = open->value.kind == attempt_kind::restore;
    if (!restore) ++refit_attempts;
    if (!opened) {
      opened = protocol_clock::now();
      out.wait_seconds = std::chrono::duration<double>(*opened - t0).count();
    }
    attempt_summary summary = watch(*open, deadline);
    if (summary.failure.empty() && !restore) {
      if (options_.before_commit) options_.before_commit(open->value);
      const auto c0 = protocol_clock::now();
      const auto result = commit_attempt(commit, *open, summary, deadline);
      out.commit_seconds = std::chrono::duration<double>(protocol_clock::now() - c0).count();
      summary.committed = result != commit_result::lost;
      out.committed = summary.committed;
      out.committed_by_other = result == commit_result::by_other;
      out.attempts.push_back(std::move(summary));
      if (out.committed) {
        committed_at = protocol_clock::now();
        cleanup(v + 1, deadline);
        out.cleanup_seconds =
            std::chrono::duration<double>(protocol_clock::now() - *committed_at).count();
        break;
      }
      // Lost: someone committed something else; re-read and stop.
      commit = expect_version_unmoved(v, deadline);
      continue;
    }
    if (restore) {
      ++out.restores;
      if (summary.failure.empty()) {
        complete_restore(open->value, summary, deadline);
      } else {
        fence(*open, deadline, &summary);
      }
      out.attempts.push_back(std::move(summary));
      continue;
    }
    // A racing coordinator may have committed meanwhile: this very attempt (then the
    // transition is done), or something else (a conflict).
    const auto now = must_read<commit_record>(keys.commit(), deadline);
    if (now.value.version == v + 1 && now.value.attempt == open->value.key.number &&
        now.value.candidate == open->value.candidate) {
      summary.committed = true;
      out.committed = true;
      out.committed_by_other = now.value.coordinator != incarnation_;
      out.attempts.push_back(std::move(summary));
      break;
    }
    if (now.value.version != v) {  // another coordinator moved on: nothing to fence here
      out.attempts.push_back(std::move(summary));
      expect_version_unmoved(v, deadline);
    }
    fence(*open, deadline, &summary);
    out.attempts.push_back(std::move(summary));
    commit = expect_version_unmoved(v, deadline);
  }
  out.seconds = std::chrono::duration<double>(committed_at.value_or(protocol_clock::now()) -
                                              opened.value_or(t0))
                    .count();
  return out;
}

template <control_plane Plane, payload_cleanup Store>
typed_record<commit_record> coordinator<Plane, Store>::expect_version_unmoved(
    std::uint64_t v, protocol_clock::time_point deadline) {
  auto commit = must_read<commit_record>(options_.keys.commit(), deadline);
  DCR_EXPECTS(commit.value.version == v, errc::commit_conflict,
              "coordinator: version " + std::to_string(commit.value.version) +
                  " was committed by someone else during transition " + std::to_string(v) + " -> " +
                  std::to_string(v + 1));
  return commit;
}

template <control_plane Plane, payload_cleanup Store>
std::map<std::string, receiver_registration> coordinator<Plane, Store>::live_receivers(
    protocol_clock::time_point deadline) {
  std::map<std::string, receiver_registration> out;
  for (auto& r : with_retry("coordinator: list receivers", deadline, [&] {
         return read_records<receiver_registration>(*plane_, options_.keys.receivers());
       }))
    out[r.name] = r;
  return out;
}

template <control_plane Plane, payload_cleanup Store>
std::map<std::uint32_t, owner_registration> coordinator<Plane, Store>::live_owners(
    protocol_clock::time_point deadline) {
  std::map<std::uint32_t, owner_registration> out;
  for (auto& r : with_retry("coordinator: list owners", deadline, [&] {
         return read_records<owner_registration>(*plane_, options_.keys.owners());
       }))
    out[r.owner] = r;
  return out;
}

template <control_plane Plane, payload_cleanup Store>
std::optional<typed_record<attempt_record>> coordinator<Plane, Store>::prepare(
    std::uint64_t v, const std::string& candidate,
    const std::optional<typed_record<attempt_record>>& previous,
    protocol_clock::time_point deadline, transition_summary& out) {
  const auto& keys = options_.keys;
  wait_for_owners(v, candidate, deadline);
  auto membership = must_read<membership_record>(keys.membership(), deadline);
  auto seen = look_at_receivers(deadline);
  wait_for_first_receivers(seen, deadline);
  wait_for_lagging_members(v, membership.value, seen, deadline);
  std::vector<std::string> joiners;
  membership_record next = next_membership(v, membership.value, seen.regs, joiners);
  if (next.receivers.empty() && joiners.empty()) {
    // No member and no joiner: every registration is gone for now (e.g. an outage outlived
    // every lease and the receivers have not registered again yet). Wait for one, until the
    // deadline, instead of giving up the transition.
    DCR_EXPECTS(protocol_clock::now() < deadline, errc::deadline_exceeded,
                "coordinator: no receiver is registered (nothing to refit) by the deadline");
    with_retry("coordinator: wait for receivers", deadline, [&] {
      return plane_->wait_for_change(
          keys.receivers(), seen.revision,
          std::min(deadline, protocol_clock::now() + std::chrono::milliseconds(200)));
    });
    return std::nullopt;  // the caller looks again
  }
  if (next.receivers != membership.value.receivers) {
    next.epoch = membership.value.epoch + 1;
    if (!with_retry("coordinator: membership", deadline, [&] {
          return put_if(*plane_, keys.membership(), encode_record(next), membership.revision);
        }))
      return std::nullopt;
  }
  const attempt_record a = next_attempt(v, candidate, previous, next, joiners, seen.regs, deadline);
  const std::int64_t expected = previous ? previous->revision : 0;
  const bool written = with_retry("coordinator: write attempt", deadline, [&] {
    return put_if(*plane_, keys.attempt(), encode_record(a), expected);
  });
  if (!written) return std::nullopt;  // a racing coordinator wrote one: look again
  (void)out;
  auto fresh = must_read<attempt_record>(keys.attempt(), deadline);
  return fresh;
}

// Each wait of prepare's steps takes the store revision before it reads, so a change made
// between the read and the wait wakes it (read-then-revision would lose that wake-up for a
// whole wait).

template <control_plane Plane, payload_cleanup Store>
void coordinator<Plane, Store>::wait_for_owners(std::uint64_t v, const std::string& candidate,
                                                protocol_clock::time_point deadline) {
  // Owners must be registered with trackers at v (a restarted owner re-registers) and hold
  // the candidate: the attempt opens when the trainer's step is there, not before.
  for (;;) {
    const auto seen =
        with_retry("coordinator: revision", deadline, [&] { return plane_->revision(); });
    auto owners = live_owners(deadline);
    bool all = true;
    for (auto id : owners_)
      all = all && owners.contains(id) && owners[id].tracker_version == v &&
            owners[id].candidate == candidate && !dead_.contains(owners[id].incarnation);
    if (all) return;
    DCR_EXPECTS(protocol_clock::now() < deadline, errc::deadline_exceeded,
                "coordinator: not every owner is registered at version " + std::to_string(v) +
                    " holding candidate '" + candidate + "'");
    with_retry("coordinator: wait for owners", deadline, [&] {
      return plane_->wait_for_change(
          options_.keys.owners(), seen,
          std::min(deadline, protocol_clock::now() + std::chrono::seconds(1)));
    });
  }
}

template <control_plane Plane, payload_cleanup Store>
typename coordinator<Plane, Store>::receivers_seen coordinator<Plane, Store>::look_at_receivers(
    protocol_clock::time_point deadline) {
  receivers_seen out;
  out.revision = with_retry("coordinator: revision", deadline, [&] { return plane_->revision(); });
  out.regs = live_receivers(deadline);
  return out;
}

template <control_plane Plane, payload_cleanup Store>
void coordinator<Plane, Store>::wait_for_first_receivers(receivers_seen& seen,
                                                         protocol_clock::time_point deadline) {
  while (!started_ && seen.regs.size() < options_.min_receivers) {
    DCR_EXPECTS(protocol_clock::now() < deadline, errc::deadline_exceeded,
                "coordinator: only " + std::to_string(seen.regs.size()) + " of " +
                    std::to_string(options_.min_receivers) + " receivers registered");
    with_retry("coordinator: wait for receivers", deadline, [&] {
      return plane_->wait_for_change(
          options_.keys.receivers(), seen.revision,
          std::min(deadline, protocol_clock::now() + std::chrono::seconds(1)));
    });
    seen = look_at_receivers(deadline);
  }
  started_ = true;
}

template <control_plane Plane, payload_cleanup Store>
void coordinator<Plane, Store>::wait_for_lagging_members(std::uint64_t v,
                                                         const membership_record& membership,
                                                         receivers_seen& seen,
                                                         protocol_clock::time_point deadline) {
  // A member that applied v (same incarnation, registration alive) may not have rewritten its
  // registration to say so yet when the next transition's prepare runs right after the
  // commit. Wait for it (bounded by attempt_timeout from the first look) instead of dropping
  // it and making it rejoin through a needless dense restore.
  for (;;) {
    bool lagging = false;
    for (const auto& [name, incarnation] : membership.receivers) {
      auto r = seen.regs.find(name);
      lagging = lagging || (r != seen.regs.end() && r->second.incarnation == incarnation &&
                            !dead_.contains(incarnation) && r->second.restored &&
                            r->second.committed_version + 1 == v);
    }
    if (!lagging) {
      lagging_since_.reset();
      return;
    }
    const auto now = protocol_clock::now();
    if (!lagging_since_) lagging_since_ = now;
    if (now - *lagging_since_ > options_.attempt_timeout || now >= deadline) return;
    with_retry("coordinator: wait for members at the committed version", deadline, [&] {
      return plane_->wait_for_change(options_.keys.receivers(), seen.revision,
                                     std::min(deadline, now + std::chrono::milliseconds(200)));
    });
    seen = look_at_receivers(deadline);
  }
}

template <control_plane Plane, payload_cleanup Store>
membership_record coordinator<Plane, Store>::next_membership(
    std::uint64_t v, const membership_record& membership,
    const std::map<std::string, receiver_registration>& regs,
    std::vector<std::string>& joiners) const {
  membership_record next = membership;
  for (auto it = next.receivers.begin(); it != next.receivers.end();) {
    auto r = regs.find(it->first);
    const bool stays = r != regs.end() && r->second.incarnation == it->second &&
                       !dead_.contains(it->second) && r->second.restored &&
                       r->second.committed_version == v;
    it = stays ? std::next(it) : next.receivers.erase(it);
  }
  for (const auto& [name, reg] : regs) {
    if (next.receivers.contains(name) || dead_.contains(reg.incarnation)) continue;
    if (reg.registry_fingerprint != fingerprint_) continue;  // another model's receiver
    if (reg.restored && reg.committed_version == v)
      next.receivers[name] = reg.incarnation;  // holds v already (its checkpoint)
    else
      joiners.push_back(name);
  }
  return next;
}

template <control_plane Plane, payload_cleanup Store>
attempt_record coordinator<Plane, Store>::next_attempt(
    std::uint64_t v, const std::string& candidate,
    const std::optional<typed_record<attempt_record>>& previous, const membership_record& next,
    const std::vector<std::string>& joiners,
    const std::map<std::string, receiver_registration>& regs,
    protocol_clock::time_point deadline) {
  attempt_record a;
  a.key.base_version = v;
  a.owners = owners_;
  a.candidate = candidate;
  a.membership_epoch = next.epoch;
  a.deadline_unix_ms = unix_ms_now() + options_.attempt_timeout.count();
  const bool same_transition = previous && previous->value.key.base_version == v;
  a.refits_before = same_transition ? previous->value.refits_before +
                                          (previous->value.kind == attempt_kind::refit ? 1 : 0)
                                    : 0;
  if (!joiners.empty()) {
    a.kind = attempt_kind::restore;
    a.key.target_version = v;
    a.key.number = same_transition ? previous->value.key.number + 1 : 0;  // numbering shared
    a.policy = encoding_policy::overwrite_only;
    a.receivers = joiners;
    return a;
  }
  a.kind = attempt_kind::refit;
  a.key.target_version = v + 1;
  a.key.number = same_transition ? previous->value.key.number + 1 : 0;
  // Attempt numbers are shared by restores and refits of a transition; only a transition's
  // very first refit attempt may use a delta encoding.
  a.policy = a.refits_before > 0 ? encoding_policy::overwrite_only : options_.policy;
  for (const auto& [name, inc] : next.receivers) {
    a.receivers.push_back(name);
    // Every member is registered (next_membership keeps or adds only registered receivers).
    if (auto r = regs.find(name); r != regs.end())
      a.overwrite_only.insert(a.overwrite_only.end(), r->second.overwrite_only.begin(),
                              r->second.overwrite_only.end());
  }
  std::sort(a.overwrite_only.begin(), a.overwrite_only.end());
  a.overwrite_only.erase(std::unique(a.overwrite_only.begin(), a.overwrite_only.end()),
                         a.overwrite_only.end());
  // Change digests owners reported for this candidate in earlier attempts.
  if (same_transition) {
    a.candidate_digests = previous->value.candidate_digests;
    if (previous->value.kind == attempt_kind::refit)
      for (const auto& r : with_retry("coordinator: reports", deadline, [&] {
             return read_records<owner_report>(*plane_, options_.keys.reports(previous->value.key));
           }))
        if (r.built) a.candidate_digests[r.owner] = r.change_digest;
  }
  return a;
}

template <control_plane Plane, payload_cleanup Store>
attempt_summary coordinator<Plane, Store>::watch(const typed_record<attempt_record>& open,
                                                 protocol_clock::time_point deadline) {
  const auto& keys = options_.keys;
  const attempt_record& a = open.value;
  attempt_summary s;
  s.key = a.key;
  s.kind = a.kind;
  s.policy = a.policy;
  const auto t0 = protocol_clock::now();
  const auto regs0 = live_receivers(deadline);
  const auto owners0 = live_owners(deadline);
  for (const auto& [id, reg] : owners0) s.owner_incarnations[id] = reg.incarnation;
  for (;;) {
    const auto seen =
        with_retry("coordinator: revision", deadline, [&] { return plane_->revision(); });
    auto rec = with_retry("coordinator: read attempt", deadline,
                          [&] { return read_record<attempt_record>(*plane_, keys.attempt()); });
    if (!rec || rec->revision != open.revision) {
      s.failure = "the attempt record changed (another coordinator)";
      break;
    }
    const auto commit = must_read<commit_record>(keys.commit(), deadline);
    if (commit.value.version != a.key.base_version) {
      s.failure = "version " + std::to_string(commit.value.version) +
                  " was committed by someone else (another coordinator)";
      break;
    }
    s.reports = with_retry("coordinator: reports", deadline, [&] {
      return read_records<owner_report>(*plane_, keys.reports(s.key));
    });
    s.acks = with_retry("coordinator: acks", deadline,
                        [&] { return read_records<receiver_ack>(*plane_, keys.acks(s.key)); });
    const auto regs = live_receivers(deadline);
    const auto owners = live_owners(deadline);
    std::size_t built = 0, applied = 0;
    for (const auto& r : s.reports) {
      if (!r.built && s.failure.empty()) s.failure = r.failure;
      built += r.built ? 1 : 0;
    }
    for (const auto& k : s.acks) {
      const bool ok =
          k.state == (a.kind == attempt_kind::restore ? ack_state::restored : ack_state::applied);
      if (!ok && s.failure.empty())
        s.failure = k.failure.empty() ? "receiver '" + k.name + "' acknowledged " +
                                            nlohmann::json(k.state).get<std::string>()
                                      : k.failure;
      applied += ok ? 1 : 0;
    }
    for (const auto& name : a.receivers) {
      auto r = regs.find(name);
      auto r0 = regs0.find(name);
      const bool acked =
          std::any_of(s.acks.begin(), s.acks.end(), [&](const auto& k) { return k.name == name; });
      if (!acked && (r == regs.end() ||
                     (r0 != regs0.end() && r->second.incarnation != r0->second.incarnation))) {
        if (s.failure.empty())
          s.failure = "receiver '" + name + "' left (lease expired or restarted)";
        if (r0 != regs0.end()) dead_.insert(r0->second.incarnation);
      }
    }
    for (auto id : a.owners) {
      auto o = owners.find(id);
      auto o0 = owners0.find(id);
      const bool reported = std::any_of(s.reports.begin(), s.reports.end(),
                                        [&](const auto& r) { return r.owner == id; });
      if (!reported && (o == owners.end() ||
                        (o0 != owners0.end() && o->second.incarnation != o0->second.incarnation))) {
        if (s.failure.empty())
          s.failure = "owner " + std::to_string(id) + " left (lease expired or restarted)";
        if (o0 != owners0.end()) dead_.insert(o0->second.incarnation);
      }
    }
    if (!s.failure.empty()) break;
    if (built == a.owners.size() && applied == a.receivers.size()) {
      // Every receiver must have applied exactly the payloads the owners' manifests list (a
      // source that reported `complete` early, or delivered another attempt's payload under
      // this one's name, is caught here, before the commit).
      std::uint64_t listed = 0, listed_digest = 0;
      for (const auto& r : s.reports) {
        listed += r.payloads;
        listed_digest += r.payload_set_digest;
      }
      for (const auto& k : s.acks)
        if (std::find(a.receivers.begin(), a.receivers.end(), k.name) != a.receivers.end() &&
            (k.applied_payloads != listed || k.applied_payload_digest != listed_digest)) {
          s.failure = "receiver '" + k.name + "' applied " + std::to_string(k.applied_payloads) +
                      " payloads of attempt " + to_string(s.key) +
                      (k.applied_payloads == listed ? " (other ones)" : "") +
                      ", the owners' manifests list " + std::to_string(listed);
          break;
        }
      break;  // can commit, unless the check above failed the attempt
    }
    if (unix_ms_now() > a.deadline_unix_ms) {
      s.failure = "attempt deadline passed";
      break;
    }
    DCR_EXPECTS(protocol_clock::now() < deadline, errc::deadline_exceeded,
                "coordinator: attempt " + to_string(s.key) + " still open at the deadline");
    with_retry("coordinator: wait", deadline, [&] {
      return plane_->wait_for_change(
          keys.all(), seen,
          std::min(deadline, protocol_clock::now() + std::chrono::milliseconds(500)));
    });
  }
  s.seconds = std::chrono::duration<double>(protocol_clock::now() - t0).count();
  return s;
}

template <control_plane Plane, payload_cleanup Store>
coordinator<Plane, Store>::commit_result coordinator<Plane, Store>::commit_attempt(
    const typed_record<commit_record>& base, const typed_record<attempt_record>& open,
    const attempt_summary& s, protocol_clock::time_point deadline) {
  const auto& keys = options_.keys;
  commit_record next;
  next.version = open.value.key.target_version;
  next.attempt = open.value.key.number;
  next.registry_fingerprint = fingerprint_;
  next.membership_epoch = open.value.membership_epoch;
  next.candidate = open.value.candidate;
  next.coordinator = incarnation_;
  std::uint64_t digest = 0;
  for (const auto& r : s.reports)
    digest = XXH64(&r.manifest_digest, sizeof r.manifest_digest, digest);
  next.manifest_digest = digest;
  attempt_record done = open.value;
  done.state = attempt_state::committed;
  const key_compare cmp[] = {{keys.commit(), base.revision},
                             {keys.attempt(), open.revision},
                             {keys.history(next.version), 0}};
  const key_write w[] = {{keys.commit(), encode_record(next), 0, false},
                         {keys.attempt(), encode_record(done), 0, false},
                         {keys.history(next.version), encode_record(next), 0, false}};
  bool ok = false;
  try {
    ok = with_retry("coordinator: commit", deadline, [&] { return plane_->transact(cmp, w); });
  } catch (const error& e) {
    if (e.dcr_code() != errc::deadline_exceeded) throw;
  }
  if (ok) return commit_result::committed;
  // A transaction whose answer was lost (an outage) may have applied, and its retry then fails
  // the compares: the record tells whose transaction it was.
  const auto now = must_read<commit_record>(keys.commit(), deadline);
  if (now.value == next) return commit_result::committed;  // ours: written by this coordinator
  commit_record same_attempt = now.value;
  same_attempt.coordinator = next.coordinator;
  if (same_attempt == next) return commit_result::by_other;  // this attempt, by another one
  return commit_result::lost;
}

template <control_plane Plane, payload_cleanup Store>
void coordinator<Plane, Store>::complete_restore(const attempt_record& a, const attempt_summary& s,
                                                 protocol_clock::time_point deadline) {
  const auto& keys = options_.keys;
  attempt_record done = a;
  done.state = attempt_state::committed;
  const auto current = must_read<attempt_record>(keys.attempt(), deadline);
  with_retry("coordinator: close restore", deadline, [&] {
    return put_if(*plane_, keys.attempt(), encode_record(done), current.revision);
  });
  (void)s;
  // Membership is updated by the next prepare(): the restored receivers re-registered with
  // restored = true at version v.
}

template <control_plane Plane, payload_cleanup Store>
void coordinator<Plane, Store>::fence(const typed_record<attempt_record>& open,
                                      protocol_clock::time_point deadline,
                                      attempt_summary* watched) {
  const auto& keys = options_.keys;
  attempt_record f = open.value;
  f.state = attempt_state::fenced;
  if (!with_retry("coordinator: fence", deadline,
                  [&] { return put_if(*plane_, keys.attempt(), encode_record(f), open.revision); }))
    return;  // changed meanwhile (another coordinator): the caller looks again
  // A receiver that is alive (its lease kept) but does not acknowledge the fence within
  // attempt_timeout (a stuck engine) leaves the membership instead of holding up the retry:
  // its incarnation is never required again, and writes it still makes land in its own
  // storage only.
  const auto patience = protocol_clock::now() + options_.attempt_timeout;
  for (;;) {
    const auto seen =
        with_retry("coordinator: revision", deadline, [&] { return plane_->revision(); });
    const auto acks = with_retry("coordinator: acks", deadline, [&] {
      return read_records<receiver_ack>(*plane_, keys.acks(f.key));
    });
    const auto regs = live_receivers(deadline);
    std::vector<std::string> waiting;  // incarnations that may still write the attempt
    for (const auto& name : f.receivers) {
      const bool acked =
          std::any_of(acks.begin(), acks.end(), [&](const auto& k) { return k.name == name; });
      auto r = regs.find(name);
      // Gone (lease expired) or restarted (a new process never wrote the old attempt).
      const bool gone = r == regs.end() || !r->second.restored ||
                        r->second.committed_version != f.key.base_version;
      if (!acked && !gone) waiting.push_back(r->second.incarnation);
    }
    // Owners: every one reported (so none is still putting payloads of the attempt) or left;
    // their final reports complete `watched`. An owner that is alive but silent past
    // attempt_timeout (one that gave up on the transition) no longer holds up the retry.
    bool owners_settled = true;
    if (watched != nullptr) {
      auto reports = with_retry("coordinator: reports", deadline, [&] {
        return read_records<owner_report>(*plane_, keys.reports(f.key));
      });
      const auto owners = live_owners(deadline);
      for (auto id : f.owners) {
        const bool reported = std::any_of(reports.begin(), reports.end(),
                                          [&](const auto& r) { return r.owner == id; });
        auto o = owners.find(id);
        auto o0 = watched->owner_incarnations.find(id);
        const bool gone = o == owners.end() || (o0 != watched->owner_incarnations.end() &&
                                                o->second.incarnation != o0->second);
        owners_settled = owners_settled && (reported || gone);
      }
      watched->reports = std::move(reports);
    }
    if (waiting.empty() && owners_settled) return;
    if (protocol_clock::now() >= patience) {
      dead_.insert(waiting.begin(), waiting.end());
      return;
    }
    DCR_EXPECTS(protocol_clock::now() < deadline, errc::deadline_exceeded,
                "coordinator: receivers and owners did not settle the fence of attempt " +
                    to_string(f.key) + " by the deadline");
    with_retry("coordinator: wait for fence", deadline, [&] {
      return plane_->wait_for_change(
          keys.all(), seen,
          std::min({deadline, patience, protocol_clock::now() + std::chrono::milliseconds(500)}));
    });
  }
}

template <control_plane Plane, payload_cleanup Store>
void coordinator<Plane, Store>::cleanup(std::uint64_t version,
                                        protocol_clock::time_point deadline) {
  try {
    if (options_.erase_after_commit) store_->erase_through(version);
  } catch (const error&) {
    // a store hiccup leaves garbage for the next commit to erase, never a wrong result
  }
  const auto& keys = options_.keys;
  try {
    with_retry("coordinator: cleanup", deadline, [&] {
      std::vector<key_write> erases;
      for (const auto* prefix : {"/reports/", "/acks/"})
        for (const auto& r : plane_->list(keys.prefix + prefix)) {
          // "<attempt>/<owner or receiver>"; keys spelled otherwise are not ours to erase.
          std::string_view tag = std::string_view(r.key).substr(keys.prefix.size() + std::strlen(prefix));
          const auto attempt = detail::take_attempt_key(tag);
          if (attempt && tag.starts_with('/') && attempt->target_version <= version)
            erases.push_back({r.key, {}, 0, true});
        }
      if (!erases.empty()) plane_->transact({}, erases);
      return 0;
    });
  } catch (const error&) {
  }
}

}  // namespace dcr
