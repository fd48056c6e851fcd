// dcr/detail/protocol/owner_agent.inl: the bodies of dcr/protocol/owner_agent.hpp (included at its
// end).
#pragma once

namespace dcr {

template <control_plane Plane, payload_sink Store>
owner_agent<Plane, Store>::owner_agent(owner& o, const tensor_registry& registry, Plane& plane,
                                       Store& store, owner_agent_options options)
    : owner_(&o),
      registry_(&registry),
      plane_(&plane),
      store_(&store),
      options_(std::move(options)),
      incarnation_(make_incarnation()) {
  DCR_EXPECTS(options_.build_threads >= 1, errc::invalid_argument,
              "owner agent: build_threads must be at least 1");
  owner_->set_chunk_bytes(options_.chunk_bytes);
  set_codec(options_.bucket_bytes, options_.codec);
}

template <control_plane Plane, payload_sink Store>
owner_agent<Plane, Store>::~owner_agent() {
  keeper_.reset();
  if (lease_ != 0) {
    try {
      plane_->revoke(lease_);
    } catch (const error&) {
    }
  }
}

template <control_plane Plane, payload_sink Store>
void owner_agent<Plane, Store>::start(std::uint64_t tracker_version,
                                      protocol_clock::time_point deadline, bool restarted) {
  tracker_version_ = tracker_version;
  restarted_ = restarted;
  with_retry("owner agent: register", deadline, [&] {
    lease_ = plane_->grant_lease(options_.lease_ttl);
    put(*plane_, options_.keys.owner(owner_->id()), encode_record(registration()), lease_);
    return 0;
  });
  keeper_ = std::make_unique<lease_keeper<Plane>>(*plane_, lease_, options_.lease_ttl);
  if (restarted) {  // the attempt open now is one its earlier self died in
    const auto a = with_retry("owner agent: read attempt", deadline, [&] {
      return read_record<attempt_record>(*plane_, options_.keys.attempt());
    });
    if (a && a->value.state == attempt_state::open) died_in_ = a->value.key;
  }
}

template <control_plane Plane, payload_sink Store>
commit_record owner_agent<Plane, Store>::serve_transition(
    const std::string& candidate, std::span<const std::span<const std::byte>> candidates,
    std::span<const std::span<const std::byte>> residual_inputs,
    protocol_clock::time_point deadline, const std::atomic<bool>* stop) {
  DCR_EXPECTS(lease_ != 0, errc::not_ready, "owner agent: serve_transition before start");
  const std::uint64_t v = tracker_version_;
  const auto& keys = options_.keys;
  if (candidate_ != candidate) {  // ready: the coordinator may open attempts of it now
    candidate_ = candidate;
    with_retry("owner agent: register candidate", deadline, [&] {
      put(*plane_, keys.owner(owner_->id()), encode_record(registration()), lease_);
      return 0;
    });
  }
  for (;;) {
    DCR_EXPECTS(stop == nullptr || !stop->load(), errc::not_ready, "owner agent: stopped");
    if (!keeper_->alive()) reregister(deadline);
    const std::int64_t seen =
        with_retry("owner agent: revision", deadline, [&] { return plane_->revision(); });
    const auto commit = with_retry("owner agent: read commit", deadline, [&] {
      return read_record<commit_record>(*plane_, keys.commit());
    });
    if (commit && commit->value.version >= v + 1) {
      DCR_EXPECTS(commit->value.version == v + 1 && commit->value.candidate == candidate,
                  errc::commit_conflict,
                  "owner " + std::to_string(owner_->id()) + ": version " +
                      std::to_string(commit->value.version) + " was committed for '" +
                      commit->value.candidate + "' but this owner's trackers hold version " +
                      std::to_string(v) + " and its candidate is '" + candidate +
                      "': restart it from the committed version");
      if (!built_in_process_)  // committed from an earlier incarnation's payloads
        owner_->build_items(candidates, encoding_policy::overwrite_only, residual_inputs,
                            options_.codec);
      owner_->commit(candidates, residual_inputs);
      tracker_version_ = v + 1;
      built_in_process_ = false;
      with_retry("owner agent: update registration", deadline, [&] {
        put(*plane_, keys.owner(owner_->id()), encode_record(registration()), lease_);
        return 0;
      });
      restarted_ = false;
      return commit->value;
    }
    const auto attempt = with_retry("owner agent: read attempt", deadline, [&] {
      return read_record<attempt_record>(*plane_, keys.attempt());
    });
    if (attempt && attempt->value.state == attempt_state::open &&
        attempt->value.key.base_version == v && !handled(attempt->value.key) &&
        std::find(attempt->value.owners.begin(), attempt->value.owners.end(), owner_->id()) !=
            attempt->value.owners.end()) {
      handle_attempt(attempt->value, candidate, candidates, residual_inputs, deadline);
      continue;
    }
    if (attempt && attempt->value.state == attempt_state::fenced &&
        attempt->value.key.base_version == v && !handled(attempt->value.key) &&
        std::find(attempt->value.owners.begin(), attempt->value.owners.end(), owner_->id()) !=
            attempt->value.owners.end()) {
      // Fenced before this owner started it: it put nothing; say so, so that the
      // coordinator's fence need not wait for this owner's lease to expire.
      handled_.push_back(attempt->value.key);
      report_ = {};
      report_.owner = owner_->id();
      report_.incarnation = incarnation_;
      report_.failure = "owner " + std::to_string(owner_->id()) + ": fenced before it started";
      write_report(attempt->value.key, deadline);
      continue;
    }
    DCR_EXPECTS(protocol_clock::now() < deadline, errc::deadline_exceeded,
                "owner " + std::to_string(owner_->id()) + ": transition " + std::to_string(v) +
                    " -> " + std::to_string(v + 1) + " not committed by the deadline");
    with_retry("owner agent: wait", deadline, [&] {
      return plane_->wait_for_change(
          keys.all(), seen, std::min(deadline, protocol_clock::now() + std::chrono::seconds(1)));
    });
  }
}

template <control_plane Plane, payload_sink Store>
void owner_agent<Plane, Store>::set_codec(std::size_t bucket_bytes, const codec_options& codec) {
  options_.bucket_bytes = bucket_bytes;
  options_.codec = codec;
  encoders_.clear();
  for (std::size_t t = 0; t < options_.build_threads; ++t) encoders_.emplace_back(codec);
}

template <control_plane Plane, payload_sink Store>
void owner_agent<Plane, Store>::reregister(protocol_clock::time_point deadline) {
  keeper_.reset();
  incarnation_ = make_incarnation();
  with_retry("owner agent: re-register", deadline, [&] {
    lease_ = plane_->grant_lease(options_.lease_ttl);
    put(*plane_, options_.keys.owner(owner_->id()), encode_record(registration()), lease_);
    return 0;
  });
  keeper_ = std::make_unique<lease_keeper<Plane>>(*plane_, lease_, options_.lease_ttl);
}

template <control_plane Plane, payload_sink Store>
owner_registration owner_agent<Plane, Store>::registration() const {
  return owner_registration{owner_->id(), incarnation_, tracker_version_, candidate_};
}

template <control_plane Plane, payload_sink Store>
bool owner_agent<Plane, Store>::handled(const attempt_key& key) const {
  return std::find(handled_.begin(), handled_.end(), key) != handled_.end();
}

template <control_plane Plane, payload_sink Store>
void owner_agent<Plane, Store>::write_report(const attempt_key& key,
                                             protocol_clock::time_point deadline) {
  with_retry("owner agent: report", deadline, [&] {
    put(*plane_, options_.keys.report(key, owner_->id()), encode_record(report_));
    return 0;
  });
}

template <control_plane Plane, payload_sink Store>
void owner_agent<Plane, Store>::handle_attempt(
    const attempt_record& a, const std::string& candidate,
    std::span<const std::span<const std::byte>> candidates,
    std::span<const std::span<const std::byte>> residual_inputs,
    protocol_clock::time_point deadline) {
  const attempt_key key = a.key;
  handled_.push_back(key);
  report_ = {};
  report_.owner = owner_->id();
  report_.incarnation = incarnation_;
  if (restarted_ && died_in_ && *died_in_ == key) {
    // An attempt that was open when this process started: its earlier self died in it.
    const auto earlier = with_retry("owner agent: read report", deadline, [&] {
      return plane_->get(options_.keys.report(key, owner_->id()));
    });
    if (!earlier) {
      report_.failure = "owner " + std::to_string(owner_->id()) + " restarted during this attempt";
      write_report(key, deadline);
      return;
    }
  }
  if (a.kind == attempt_kind::refit && a.candidate != candidate) {
    report_.failure = "attempt names candidate '" + a.candidate + "', owner " +
                      std::to_string(owner_->id()) + " holds '" + candidate + "'";
    write_report(key, deadline);
    return;
  }
  try {
    owner_->set_overwrite_only(a.overwrite_only);
    if (a.kind == attempt_kind::restore) {
      // A dense overwrite of the committed version: the trackers are the candidates.
      restore_spans_.clear();
      for (std::size_t i = 0; i < owner_->tasks().size(); ++i)
        restore_spans_.push_back(owner_->tracker(i));
      restore_inputs_.clear();
      for (std::size_t r = 0; r < owner_->residual_tasks().size(); ++r)
        for (std::size_t k = 0; k < owner_->residual_tasks()[r].inputs.size(); ++k)
          restore_inputs_.push_back(owner_->residual_input_copy(r, k));
      build_and_put(a, restore_spans_, restore_inputs_, build_mode::dense,
                    encoding_policy::overwrite_only, deadline);
    } else {
      build_mode mode = build_mode::changes;
      if (auto it = a.candidate_digests.find(owner_->id());
          it != a.candidate_digests.end() && !built_in_process_) {
        // Restarted mid-transition: are these the candidates an earlier attempt sent?
        owner_->build_items(candidates, encoding_policy::overwrite_only, residual_inputs,
                            options_.codec);
        if (owner_->change_digest() != it->second) mode = build_mode::dense;
      }
      build_and_put(a, candidates, residual_inputs, mode, a.policy, deadline);
      built_in_process_ = true;
    }
    report_.built = true;
  } catch (const error& e) {
    report_.built = false;
    report_.failure = "owner " + std::to_string(owner_->id()) + ": " + e.what();
  }
  report_.peak_rss_bytes = peak_rss_bytes();
  write_report(key, deadline);
}

template <control_plane Plane, payload_sink Store>
void owner_agent<Plane, Store>::build_and_put(
    const attempt_record& a, std::span<const std::span<const std::byte>> sources,
    std::span<const std::span<const std::byte>> residual_inputs, build_mode mode,
    encoding_policy policy, protocol_clock::time_point /*deadline*/) {
  const auto t0 = clock::now();
  const double u0 = unix_seconds_now();
  timeline_.clear();
  ids_.clear();
  // A push transport routes by attempt: it learns the attempt, its receivers and its
  // deadline first.
  if constexpr (attempt_routed_sink<Store>)
    store_->open_attempt(a.key, a.receivers,
                         clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(
                                            0, a.deadline_unix_ms - unix_ms_now())));
  std::uint32_t sequence = 0;
  std::uint64_t records = 0;
  double compress = 0, put_time = 0;
  // The stage thread records its spans apart from the building thread's (one writer each);
  // they are merged into timeline_ once the stage has drained.
  std::vector<stage_span> put_spans;
  payload_header header;
  header.id = payload_id{a.key, owner_->id(), 0};
  header.registry_fingerprint = registry_->fingerprint();
  // Puts payloads_ (packed since c0), in order.
  auto put_packed = [&](clock::time_point c0) {
    const auto c1 = clock::now();
    for (std::size_t k = 0; k < payloads_.size(); ++k) {
      const auto& p = payloads_[k];
      store_->put(payload_ids_[k], p);
      ids_.push_back(payload_ids_[k]);
      report_.payload_bytes += p.size();
      ++report_.payloads;
      if (options_.after_put) options_.after_put(a, report_.payloads);
    }
    const auto c2 = clock::now();
    compress += seconds(c1 - c0);
    put_time += seconds(c2 - c1);
    put_spans.push_back({"compress+put", u0 + seconds(c0 - t0), u0 + seconds(c2 - t0)});
  };
  // Stage thread: pack + compress, then put.
  auto pack_and_put = [&](std::vector<item>& items) {
    const auto c0 = clock::now();
    header.id.sequence = sequence;
    sequence = pack_payloads(*registry_, header, items, options_.bucket_bytes, encoders_[0],
                             payloads_, &payload_ids_);
    put_packed(c0);
  };
  double build = 0;
  if (owner_->payload_threads(encoders_.size()) > 1) {
    // Built, then compressed, on every thread; put here once all is packed.
    const auto b0 = clock::now();
    build_payloads_summary built;
    owner_->build_payloads(sources, policy, residual_inputs, options_.codec, mode, header,
                           options_.bucket_bytes, encoders_, payloads_, &payload_ids_, &built);
    const auto b1 = b0 + std::chrono::duration_cast<clock::duration>(
                             std::chrono::duration<double>(built.build_seconds));
    build = built.build_seconds;
    records = built.records;
    timeline_.push_back({"build", u0 + seconds(b0 - t0), u0 + seconds(b1 - t0)});
    put_packed(b1);
  } else if (options_.pipelined) {
    pipeline_stage<std::vector<item>> stage(options_.queue_depth, pack_and_put);
    for (std::size_t k = 0; k < owner_->chunk_count(); ++k) {
      const auto b0 = clock::now();
      std::vector<item> items =
          owner_->build_chunk(k, sources, policy, residual_inputs, options_.codec, mode);
      const auto b1 = clock::now();
      build += seconds(b1 - b0);
      timeline_.push_back({"build", u0 + seconds(b0 - t0), u0 + seconds(b1 - t0)});
      for (const auto& it : items) records += it.count();
      if (!items.empty()) stage.submit(std::move(items));
    }
    stage.drain();
  } else {
    const auto b0 = clock::now();
    std::vector<item> items =
        owner_->build_items(sources, policy, residual_inputs, options_.codec, mode);
    const auto b1 = clock::now();
    build = seconds(b1 - b0);
    timeline_.push_back({"build", u0 + seconds(b0 - t0), u0 + seconds(b1 - t0)});
    for (const auto& it : items) records += it.count();
    pack_and_put(items);
  }
  timeline_.insert(timeline_.end(), put_spans.begin(), put_spans.end());
  std::stable_sort(timeline_.begin(), timeline_.end(),
                   [](const stage_span& x, const stage_span& y) { return x.begin < y.begin; });
  store_->put_manifest(a.key, owner_->id(), ids_);
  std::uint64_t digest = 0;
  std::uint64_t set_digest = 0;
  for (const auto& id : ids_) {
    const std::uint64_t h = payload_id_digest(id);
    digest = XXH64(&h, sizeof h, digest);
    set_digest += h;
  }
  report_.manifest_digest = digest;
  report_.payload_set_digest = set_digest;
  report_.change_digest = owner_->change_digest();
  report_.records = records;
  report_.stats = owner_->stats();
  report_.build_seconds = build;
  report_.compress_seconds = compress;
  report_.put_seconds = put_time;
  report_.seconds = seconds(clock::now() - t0);
}

}  // namespace dcr
