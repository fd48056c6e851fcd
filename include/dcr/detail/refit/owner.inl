// dcr/detail/refit/owner.inl: the bodies of dcr/refit/owner.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

DCR_INLINE std::size_t detail::bucket_item_count(std::span<const item> items,
                                                 std::size_t bucket_bytes) noexcept {
  std::size_t end = 0, bytes = 0;
  do {
    bytes += items[end].count() * (8 + items[end].word_bytes());
    ++end;
  } while (end < items.size() &&
           bytes + items[end].count() * (8 + items[end].word_bytes()) <= bucket_bytes);
  return end;
}

DCR_INLINE owner::~owner() = default;

DCR_INLINE owner::owner(const tensor_registry& registry, std::uint32_t id,
                        std::vector<affine_task> tasks, std::vector<residual_task> residual)
    : registry_(&registry), id_(id), tasks_(std::move(tasks)), residual_(std::move(residual)) {
  validate_task_set(registry, tasks_, residual_);
  trackers_.resize(tasks_.size());
  changed_.resize(tasks_.size());
  projected_.resize(tasks_.size());
  transition_changed_.resize(tasks_.size());
  gathered_old_.resize(tasks_.size());
  gathered_new_.resize(tasks_.size());
  gathered_.assign(tasks_.size(), 0);

  for (const auto& t : tasks_)
    for (auto target : t.targets) add_slot(target, false);
  residual_state_.resize(residual_.size());
  std::size_t max_output = 0;
  for (std::size_t r = 0; r < residual_.size(); ++r) {
    const auto& task = residual_[r];
    auto& st = residual_state_[r];
    st.first_input = residual_input_count_;
    residual_input_count_ += task.inputs.size();
    st.input_copies.resize(task.inputs.size());
    st.changed_inputs.resize(task.inputs.size());
    st.baseline.resize(task.outputs.size());
    st.selected.assign(task.outputs.size(), 0);
    st.union_indices.resize(task.outputs.size());
    st.union_selected.assign(task.outputs.size(), 0);
    for (const auto& out : task.outputs) {
      st.output_slot.push_back(add_slot(out.tensor, true));
      max_output = std::max(max_output, static_cast<std::size_t>(registry.at(out.tensor).bytes()));
    }
  }
  max_output_bytes_ = max_output;
  scratch_.output.resize(max_output);
  records_.resize(targets_.size());
  overwrite_only_.assign(targets_.size(), 0);
  slot_order_.resize(targets_.size());
  std::iota(slot_order_.begin(), slot_order_.end(), 0u);
  std::sort(slot_order_.begin(), slot_order_.end(),
            [&](auto a, auto b) { return targets_[a] < targets_[b]; });
  set_chunk_bytes(std::size_t{64} << 20);
}

DCR_INLINE void owner::set_chunk_bytes(std::size_t bytes) {
  // Affine tasks connected through shared targets form groups (union-find over slots).
  std::vector<std::uint32_t> parent(targets_.size());
  std::iota(parent.begin(), parent.end(), 0u);
  auto find = [&](std::uint32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (const auto& t : tasks_)
    for (std::size_t p = 1; p < t.targets.size(); ++p)
      parent[find(slot_of_.at(t.targets[p]))] = find(slot_of_.at(t.targets[0]));
  std::map<tensor_id, std::vector<std::size_t>> groups;  // keyed by smallest target
  std::map<std::uint32_t, tensor_id> group_key;
  for (auto slot : slot_order_)
    if (!slot_residual_[slot]) group_key.try_emplace(find(slot), targets_[slot]);
  for (std::size_t i = 0; i < tasks_.size(); ++i)
    groups[group_key.at(find(slot_of_.at(tasks_[i].targets[0])))].push_back(i);
  chunks_.clear();
  chunk current;
  std::size_t current_bytes = 0;
  for (auto& [key, group] : groups) {
    std::size_t b = 0;
    for (auto i : group) b += tasks_[i].bytes();
    if (!current.tasks.empty() && current_bytes + b > bytes) {
      chunks_.push_back(std::move(current));
      current = {};
      current_bytes = 0;
    }
    current.tasks.insert(current.tasks.end(), group.begin(), group.end());
    current_bytes += b;
  }
  if (!current.tasks.empty()) chunks_.push_back(std::move(current));
  for (std::size_t r = 0; r < residual_.size(); ++r) chunks_.push_back(chunk{{}, {r}, {}});
  for (auto& c : chunks_) {
    for (auto i : c.tasks)
      for (auto t : tasks_[i].targets) c.slots.push_back(slot_of_.at(t));
    for (auto r : c.residual)
      for (auto sl : residual_state_[r].output_slot) c.slots.push_back(sl);
    std::sort(c.slots.begin(), c.slots.end(),
              [&](auto a, auto b) { return targets_[a] < targets_[b]; });
    c.slots.erase(std::unique(c.slots.begin(), c.slots.end()), c.slots.end());
  }
  chunk_built_.assign(chunks_.size(), 0);
}

DCR_INLINE std::span<const residual_task> owner::residual_tasks() const noexcept {
  return residual_;
}

DCR_INLINE std::uint64_t owner::tracker_bytes() const noexcept {
  std::uint64_t b = 0;
  for (const auto& t : trackers_) b += t.size();
  for (const auto& st : residual_state_)
    for (const auto& c : st.input_copies) b += c.size();
  return b;
}

DCR_INLINE std::uint64_t owner::residual_baseline_bytes() const noexcept {
  std::uint64_t b = 0;
  for (const auto& st : residual_state_)
    for (const auto& o : st.baseline) b += o.size();
  return b;
}

DCR_INLINE void owner::set_detect_backend(detect_backend* backend) {
  if (backend != nullptr && initialized_) {  // may throw: keep the old one
    std::vector<std::span<const std::byte>> committed(trackers_.begin(), trackers_.end());
    backend->initialize(tasks_, committed);
  }
  detector_ = backend;
  for (auto& p : projected_) p.valid = false;
}

DCR_INLINE std::string owner::detect_device() const {
  return detector_ != nullptr ? detector_->device() : std::string("cpu");
}

DCR_INLINE void owner::initialize(std::span<const std::span<const std::byte>> committed,
                                  std::span<const std::span<const std::byte>> residual_committed) {
  check_inputs(committed, "initialize");
  check_residual_inputs(residual_committed, "initialize");
  initialized_ = false;
  built_ = false;
  for (std::size_t i = 0; i < tasks_.size(); ++i)
    trackers_[i].assign(committed[i].begin(), committed[i].end());
  if (detector_ != nullptr) detector_->initialize(tasks_, committed);
  for (std::size_t r = 0; r < residual_.size(); ++r) {
    const auto& task = residual_[r];
    auto& st = residual_state_[r];
    const auto inputs = residual_committed.subspan(st.first_input, task.inputs.size());
    for (std::size_t k = 0; k < inputs.size(); ++k)
      st.input_copies[k].assign(inputs[k].begin(), inputs[k].end());
    for (std::size_t o = 0; o < task.outputs.size(); ++o) {
      const auto bytes = registry_->at(task.outputs[o].tensor).bytes();
      st.baseline[o].resize(static_cast<std::size_t>(bytes));
      task.convert(o, inputs, st.baseline[o]);
    }
  }
  initialized_ = true;
  transition_open_ = false;
}

DCR_INLINE void owner::set_overwrite_only(std::span<const tensor_id> tensors) {
  for (auto id : tensors)
    DCR_EXPECTS(id < registry_->size(), errc::unknown_tensor,
                "owner::set_overwrite_only: tensor id " + std::to_string(id) +
                    " is not in the registry (" + std::to_string(registry_->size()) + " tensors)");
  std::fill(overwrite_only_.begin(), overwrite_only_.end(), std::uint8_t{0});
  for (auto id : tensors)
    if (auto it = slot_of_.find(id); it != slot_of_.end()) overwrite_only_[it->second] = 1;
}

DCR_INLINE const std::vector<item>& owner::build_items(
    std::span<const std::span<const std::byte>> candidates, encoding_policy policy,
    std::span<const std::span<const std::byte>> residual_inputs, const codec_options& codec,
    build_mode mode) {
  all_items_.clear();
  for (std::size_t k = 0; k < chunks_.size(); ++k) {
    const auto& items = build_chunk(k, candidates, policy, residual_inputs, codec, mode);
    all_items_.insert(all_items_.end(), items.begin(), items.end());
  }
  if (chunks_.empty()) {
    check_inputs(candidates, "build_items");
    stats_ = {};
  }
  std::stable_sort(all_items_.begin(), all_items_.end(),
                   [](const item& a, const item& b) { return a.tensor < b.tensor; });
  return all_items_;
}

DCR_INLINE const std::vector<item>& owner::build_chunk(
    std::size_t k, std::span<const std::span<const std::byte>> candidates, encoding_policy policy,
    std::span<const std::span<const std::byte>> residual_inputs, const codec_options& codec,
    build_mode mode) {
  begin_chunk(k, candidates, residual_inputs, mode);
  owner_stats chunk_stats;
  return_buffers(items_);  // the previous call's items are done with
  build_chunk_items(k, candidates, policy, residual_inputs, codec, mode, scratch_, items_,
                    chunk_stats);
  stats_ += chunk_stats;
  digest_chunk(items_);
  chunk_built_[k] = 1;
  built_ = std::all_of(chunk_built_.begin(), chunk_built_.end(), [](auto b) { return b != 0; });
  return items_;
}

DCR_INLINE std::uint32_t owner::build_payloads(
    std::span<const std::span<const std::byte>> candidates, encoding_policy policy,
    std::span<const std::span<const std::byte>> residual_inputs, const codec_options& codec,
    build_mode mode, const payload_header& header, std::size_t bucket_bytes,
    std::span<payload_encoder> encoders, std::vector<std::vector<std::byte>>& out,
    std::vector<payload_id>* ids, build_payloads_summary* summary) {
  DCR_EXPECTS(!encoders.empty(), errc::invalid_argument, "owner::build_payloads: no encoder");
  out.clear();
  if (ids != nullptr) ids->clear();
  if (summary != nullptr) *summary = {};
  const std::size_t n = chunks_.size();
  if (n == 0) return header.id.sequence;
  const std::size_t threads = payload_threads(encoders.size());
  const auto t0 = clock::now();
  begin_chunk(0, candidates, residual_inputs, mode);
  built_ = false;
  chunk_items_.resize(n);
  chunk_stats_.assign(n, owner_stats{});
  if (pool_scratch_.size() + 1 < threads) pool_scratch_.resize(threads - 1);
  detail::parallel_for(n, threads, [&](std::size_t t, std::size_t k) {
    build_scratch& scratch = t == 0 ? scratch_ : pool_scratch_[t - 1];
    if (scratch.output.size() < max_output_bytes_) scratch.output.resize(max_output_bytes_);
    build_chunk_items(k, candidates, policy, residual_inputs, codec, mode, scratch,
                      chunk_items_[k], chunk_stats_[k]);
  });
  for (std::size_t k = 0; k < n; ++k) {
    stats_ += chunk_stats_[k];
    digest_chunk(chunk_items_[k]);
  }
  if (summary != nullptr) {
    summary->build_seconds = seconds(clock::now() - t0);
    for (const auto& items : chunk_items_)
      for (const auto& it : items) summary->records += it.count();
  }

  // Payloads in chunk order, split as pack_payloads splits each chunk's items, then numbered.
  struct bucket {
    std::size_t chunk, begin, end;
  };
  std::vector<bucket> buckets;
  for (std::size_t k = 0; k < n; ++k) {
    const std::vector<item>& items = chunk_items_[k];
    for (std::size_t begin = 0; begin < items.size();) {
      const std::size_t end = begin + detail::bucket_item_count(
                                          std::span<const item>(items).subspan(begin), bucket_bytes);
      buckets.push_back({k, begin, end});
      begin = end;
    }
  }
  out.resize(buckets.size());
  std::vector<payload_id> numbered(buckets.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    numbered[b] = header.id;
    numbered[b].sequence = header.id.sequence + static_cast<std::uint32_t>(b);
  }
  detail::parallel_for(buckets.size(), threads, [&](std::size_t t, std::size_t b) {
    payload_header h = header;
    h.id = numbered[b];
    const std::span<const item> items(chunk_items_[buckets[b].chunk]);
    encoders[t].encode(h, items.subspan(buckets[b].begin, buckets[b].end - buckets[b].begin),
                       *registry_, out[b]);
  });
  if (ids != nullptr) *ids = std::move(numbered);
  for (auto& items : chunk_items_) return_buffers(items);
  std::fill(chunk_built_.begin(), chunk_built_.end(), std::uint8_t{1});
  built_ = true;
  return header.id.sequence + static_cast<std::uint32_t>(buckets.size());
}

DCR_INLINE void owner::begin_chunk(std::size_t k,
                                   std::span<const std::span<const std::byte>> candidates,
                                   std::span<const std::span<const std::byte>> residual_inputs,
                                   build_mode mode) {
  DCR_EXPECTS(initialized_, errc::not_ready, "owner::build_chunk before initialize");
  DCR_EXPECTS(
      k < chunks_.size(), errc::out_of_range,
      "owner::build_chunk: chunk " + std::to_string(k) + " of " + std::to_string(chunks_.size()));
  check_inputs(candidates, "build_items");
  check_residual_inputs(residual_inputs, "build_items");
  if (k == 0) {
    stats_ = {};
    change_digest_ = 0;
    std::fill(chunk_built_.begin(), chunk_built_.end(), std::uint8_t{0});
    if (!transition_open_) {
      for (auto& c : transition_changed_) c.clear();
      for (auto& st : residual_state_) {
        for (auto& u : st.union_indices) u.clear();
        std::fill(st.union_selected.begin(), st.union_selected.end(), std::uint8_t{0});
      }
    }
    transition_open_ = true;
    last_mode_ = mode;
  }
  built_ = false;
}

DCR_INLINE void owner::build_chunk_items(
    std::size_t k, std::span<const std::span<const std::byte>> candidates, encoding_policy policy,
    std::span<const std::span<const std::byte>> residual_inputs, const codec_options& codec,
    build_mode mode, build_scratch& scratch, std::vector<item>& items, owner_stats& stats) {
  const chunk& c = chunks_[k];
  for (auto slot : c.slots) records_[slot].clear();
  items.clear();

  auto t0 = clock::now();
  for (auto i : c.tasks) {
    changed_[i].clear();
    gathered_old_[i].clear();
    gathered_new_[i].clear();
    gathered_[i] = 0;
    projected_[i].valid = false;
    if (mode == build_mode::dense) {
      changed_[i].resize(tasks_[i].bytes() / dtype_size(tasks_[i].type));
      std::iota(changed_[i].begin(), changed_[i].end(), std::uint64_t{0});
    } else {
      if (detector_ != nullptr) {
        detector_->detect(i, candidates[i], changed_[i], projected_[i]);
        check_projected(i);
      } else {
        // One pass: the changed indices and their old and new words.
        visit_word(dtype_size(tasks_[i].type), [&](auto w) {
          using W = decltype(w);
          detect_and_gather<W>(words_of<W>(std::span<const std::byte>(trackers_[i])),
                               words_of<W>(candidates[i]), changed_[i], gathered_old_[i],
                               gathered_new_[i]);
        });
        gathered_[i] = 1;
      }
      stats.changed_elements += changed_[i].size();
      unite(transition_changed_[i], changed_[i]);
      if (transition_changed_[i].size() != changed_[i].size()) {
        // An earlier attempt sent more: the union is projected and gathered here.
        changed_[i] = transition_changed_[i];
        gathered_[i] = 0;
        projected_[i].valid = false;
      }
    }
    stats.compared_bytes += candidates[i].size();
  }
  auto t1 = clock::now();
  for (auto i : c.tasks) project(i, candidates[i], gathered_[i] != 0, scratch);
  for (auto slot : c.slots) records_[slot].sort_by_index();
  auto t2 = clock::now();
  stats.detect_seconds += seconds(t1 - t0);
  stats.project_seconds += seconds(t2 - t1);

  for (auto r : c.residual) build_residual(r, residual_inputs, mode, scratch, stats);

  auto t3 = clock::now();
  for (auto slot : c.slots) {
    auto& r = records_[slot];
    if (r.indices.empty()) continue;
    const auto& t = registry_->at(targets_[slot]);
    const bool residual = slot_residual_[slot] != 0;
    const bool forced = !residual && overwrite_only_[slot] != 0;
    const bool delta_permitted =
        !residual && !forced && r.delta_encodable && mode == build_mode::changes;
    item it;
    it.tensor = targets_[slot];
    it.type = t.type;
    // The record lends its indices and gathered old words to the item (the old words are turned
    // into values in place; return_buffers takes them back once the items are packed); it keeps
    // its new words for digest_chunk, and a residual output's record its indices too, for
    // commit().
    if (residual)
      it.indices = r.indices;
    else
      it.indices.swap(r.indices);
    it.values.swap(r.old_bytes);
    visit_word(dtype_size(t.type), [&](auto w) {
      using W = decltype(w);
      const std::span<const W> new_words(reinterpret_cast<const W*>(r.new_bytes.data()),
                                         it.indices.size());
      encode_gathered_item<W>(it, new_words, policy, delta_permitted, codec);
    });
    items.push_back(std::move(it));
    stats.residual_items += residual ? 1 : 0;
    stats.forced_overwrite_items += forced && r.delta_encodable ? 1 : 0;
  }
  stats.items += items.size();
  stats.encode_seconds += seconds(clock::now() - t3);
}

DCR_INLINE void owner::return_buffers(std::vector<item>& items) {
  for (item& it : items) {
    const std::uint32_t slot = slot_of_.at(it.tensor);
    record_buffer& r = records_[slot];
    if (slot_residual_[slot] == 0) r.indices.swap(it.indices);
    r.old_bytes.swap(it.values);
  }
  items.clear();
}

DCR_INLINE void owner::digest_chunk(std::span<const item> items) {
  for (const item& it : items) {
    const tensor_id target = it.tensor;
    const auto& new_bytes = records_[slot_of_.at(target)].new_bytes;
    change_digest_ = XXH64(&target, sizeof target, change_digest_);
    change_digest_ =
        XXH64(it.indices.data(), it.indices.size() * sizeof(std::uint64_t), change_digest_);
    change_digest_ = XXH64(new_bytes.data(), new_bytes.size(), change_digest_);
  }
}

DCR_INLINE void owner::commit(std::span<const std::span<const std::byte>> candidates,
                              std::span<const std::span<const std::byte>> residual_inputs) {
  DCR_EXPECTS(built_, errc::not_ready, "owner::commit without a built changed set");
  check_inputs(candidates, "commit");
  check_residual_inputs(residual_inputs, "commit");
  for (std::size_t i = 0; i < tasks_.size(); ++i) {
    if (last_mode_ == build_mode::dense)
      std::memcpy(trackers_[i].data(), candidates[i].data(), candidates[i].size());
    else
      copy_words(trackers_[i], candidates[i], transition_changed_[i], dtype_size(tasks_[i].type));
    if (detector_ != nullptr)
      detector_->commit(i, candidates[i], transition_changed_[i], last_mode_ == build_mode::dense);
  }
  for (std::size_t r = 0; r < residual_.size(); ++r) {
    const auto& task = residual_[r];
    auto& st = residual_state_[r];
    for (std::size_t k = 0; k < task.inputs.size(); ++k) {
      const auto in = residual_inputs[st.first_input + k];
      if (!st.input_copies[k].empty()) std::memcpy(st.input_copies[k].data(), in.data(), in.size());
    }
    for (std::size_t o = 0; o < task.outputs.size(); ++o) {
      if (!st.selected[o]) continue;
      const record_buffer& rec = records_[st.output_slot[o]];
      const std::size_t wb = rec.word_bytes;
      std::byte* dst = st.baseline[o].data();
      for (std::size_t k = 0; k < rec.indices.size(); ++k)
        std::memcpy(dst + rec.indices[k] * wb, rec.new_bytes.data() + k * wb, wb);
    }
  }
  built_ = false;
  transition_open_ = false;
}

DCR_INLINE std::span<const std::byte> owner::residual_input_copy(std::size_t task,
                                                                 std::size_t input) const {
  return residual_state_.at(task).input_copies.at(input);
}

DCR_INLINE std::span<const std::byte> owner::residual_baseline(std::size_t task,
                                                               std::size_t output) const {
  return residual_state_.at(task).baseline.at(output);
}

DCR_INLINE void owner::unite(std::vector<std::uint64_t>& a, const std::vector<std::uint64_t>& b) {
  if (a.empty()) {
    a = b;
    return;
  }
  if (b.empty()) return;
  // A retry from the same candidates finds the same set again: a comparison that allocates
  // nothing tells it apart from a set that grew.
  const bool included = b.size() == a.size()
                            ? std::equal(a.begin(), a.end(), b.begin())  // one memcmp
                            : b.size() < a.size() &&
                                  std::includes(a.begin(), a.end(), b.begin(), b.end());
  if (included) return;
  std::vector<std::uint64_t> out;
  out.reserve(a.size() + b.size());
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  a.swap(out);
}

DCR_INLINE std::uint32_t owner::add_slot(tensor_id target, bool residual) {
  if (auto it = slot_of_.find(target); it != slot_of_.end()) return it->second;
  const auto slot = static_cast<std::uint32_t>(targets_.size());
  slot_of_.emplace(target, slot);
  targets_.push_back(target);
  slot_residual_.push_back(residual ? 1 : 0);
  return slot;
}

DCR_INLINE void owner::copy_words(std::vector<std::byte>& dst, std::span<const std::byte> src,
                                  std::span<const std::uint64_t> changed, std::size_t word_bytes) {
  std::byte* d = dst.data();
  const std::byte* s = src.data();
  for (auto j : changed) std::memcpy(d + j * word_bytes, s + j * word_bytes, word_bytes);
}

DCR_INLINE void owner::build_residual(std::size_t r,
                                      std::span<const std::span<const std::byte>> residual_inputs,
                                      build_mode mode, build_scratch& scratch,
                                      owner_stats& stats) {
  const auto& task = residual_[r];
  auto& st = residual_state_[r];
  const auto inputs = residual_inputs.subspan(st.first_input, task.inputs.size());

  const auto f0 = clock::now();
  for (std::size_t k = 0; k < task.inputs.size(); ++k) {
    st.changed_inputs[k].clear();
    visit_word(dtype_size(task.inputs[k].type), [&](auto w) {
      using W = decltype(w);
      detect_changes<W>(words_of<W>(std::span<const std::byte>(st.input_copies[k])),
                        words_of<W>(inputs[k]), st.changed_inputs[k]);
    });
    stats.residual_compared_bytes += inputs[k].size();
    stats.residual_changed_inputs += st.changed_inputs[k].empty() ? 0 : 1;
  }
  for (std::size_t o = 0; o < task.outputs.size(); ++o) {
    bool selected = mode == build_mode::dense || st.union_selected[o] != 0;
    for (std::size_t k = 0; k < task.inputs.size() && !selected; ++k)
      selected = !st.changed_inputs[k].empty() && task.depends(o, k);
    st.selected[o] = selected ? 1 : 0;
    if (mode == build_mode::changes) st.union_selected[o] |= st.selected[o];
  }
  stats.residual_detect_seconds += seconds(clock::now() - f0);

  for (std::size_t o = 0; o < task.outputs.size(); ++o) {
    if (!st.selected[o]) continue;
    const auto& t = registry_->at(task.outputs[o].tensor);
    const std::span<std::byte> out(scratch.output.data(), static_cast<std::size_t>(t.bytes()));
    const auto c0 = clock::now();
    task.convert(o, inputs, out);
    const auto c1 = clock::now();
    record_buffer& rec = records_[st.output_slot[o]];
    const std::size_t wb = dtype_size(t.type);
    rec.word_bytes = wb;
    rec.delta_encodable = false;
    visit_word(wb, [&](auto w) {
      using W = decltype(w);
      const auto committed = words_of<W>(std::span<const std::byte>(st.baseline[o]));
      const auto rebuilt = words_of<W>(std::span<const std::byte>(out));
      if (mode == build_mode::dense) {
        rec.indices.resize(rebuilt.size());
        std::iota(rec.indices.begin(), rec.indices.end(), std::uint64_t{0});
      } else {
        detect_changes<W>(committed, rebuilt, rec.indices);
        unite(st.union_indices[o], rec.indices);
        if (st.union_indices[o].size() != rec.indices.size()) rec.indices = st.union_indices[o];
      }
      const std::size_t n = rec.indices.size();
      rec.old_bytes.resize(n * wb);
      rec.new_bytes.resize(n * wb);
      W* old_words = reinterpret_cast<W*>(rec.old_bytes.data());
      W* new_words = reinterpret_cast<W*>(rec.new_bytes.data());
      for (std::size_t k = 0; k < n; ++k) {
        old_words[k] = committed[rec.indices[k]];
        new_words[k] = rebuilt[rec.indices[k]];
      }
    });
    stats.residual_conversions += 1;
    stats.residual_converted_bytes += out.size();
    stats.residual_changed_elements += rec.indices.size();
    stats.convert_seconds += seconds(c1 - c0);
    stats.residual_compare_seconds += seconds(clock::now() - c1);
  }
}

DCR_INLINE void owner::project(std::size_t i, std::span<const std::byte> candidate, bool gathered,
                               build_scratch& scratch) {
  const auto& task = tasks_[i];
  const std::span<const std::uint64_t> changed = changed_[i];
  if (changed.empty()) return;
  const std::size_t wb = dtype_size(task.type);
  std::visit(
      [&](const auto& m) {
        scratch.part_records.assign(task.targets.size(), nullptr);
        scratch.part_fill.assign(task.targets.size(), 0);
        for (std::size_t p = 0; p < task.targets.size(); ++p) {
          auto* r = &records_[slot_of_.at(task.targets[p])];
          r->word_bytes = wb;
          r->delta_encodable = r->delta_encodable && task.delta_encodable;
          scratch.part_records[p] = r;
        }
        // Coordinates the detect backend projected (check_projected vetted them), or m(j).
        // Groups of changed[k0 .. k1) landing at d.index + changed[k] - j0 in part d.part: one
        // element each from the backend, whole mapping runs otherwise.
        const projected_changes* const pc = projected_[i].valid ? &projected_[i] : nullptr;
        const auto for_each_group = [&](auto&& f) {
          if (pc == nullptr) return for_each_mapped_run(m, changed, f);
          for (std::size_t k = 0; k < changed.size(); ++k)
            f(k, k + 1, mapped_index{pc->part.empty() ? 0u : pc->part[k], pc->index[k]},
              changed[k]);
        };
        if (task.targets.size() == 1 && gathered && pc == nullptr &&
            scratch.part_records[0]->indices.empty()) {
          // The task is the tensor's first: its records are this task's changed words in this
          // order, so the gathered words become the record's own buffers (swapped, not copied),
          // and the indices are shifted in place, group by group.
          record_buffer& r = *scratch.part_records[0];
          std::uint64_t* index = changed_[i].data();
          for_each_group([&](std::size_t k0, std::size_t k1, mapped_index d, std::uint64_t j0) {
            const std::uint64_t shift = d.index - j0;  // modular: d.index + (j - j0)
            if (shift != 0)
              for (std::size_t k = k0; k < k1; ++k) index[k] += shift;
            if (k0 > 0 && index[k0] <= index[k0 - 1]) r.sorted = false;
          });
          r.indices.swap(changed_[i]);
          r.old_bytes.swap(gathered_old_[i]);
          r.new_bytes.swap(gathered_new_[i]);
          return;
        }
        if (task.targets.size() == 1) {
          scratch.part_fill[0] = changed.size();
        } else {
          for_each_group([&](std::size_t k0, std::size_t k1, mapped_index d, std::uint64_t) {
            scratch.part_fill[d.part] += k1 - k0;
          });
        }
        for (std::size_t p = 0; p < task.targets.size(); ++p) {
          record_buffer& r = *scratch.part_records[p];
          const std::size_t at = r.indices.size();
          r.indices.resize(at + scratch.part_fill[p]);
          r.old_bytes.resize((at + scratch.part_fill[p]) * wb);
          r.new_bytes.resize((at + scratch.part_fill[p]) * wb);
          scratch.part_fill[p] = at;  // now the next free slot
        }
        visit_word(wb, [&](auto w) {
          using W = decltype(w);
          const W* tracker_words = reinterpret_cast<const W*>(trackers_[i].data());
          const W* candidate_words = reinterpret_cast<const W*>(candidate.data());
          const W* gathered_old = reinterpret_cast<const W*>(gathered_old_[i].data());
          const W* gathered_new = reinterpret_cast<const W*>(gathered_new_[i].data());
          for_each_group([&](std::size_t k0, std::size_t k1, mapped_index d, std::uint64_t j0) {
            record_buffer& r = *scratch.part_records[d.part];
            const std::size_t at = scratch.part_fill[d.part];
            scratch.part_fill[d.part] += k1 - k0;
            std::uint64_t* index = r.indices.data() + at;
            const std::uint64_t shift = d.index - j0;  // modular: d.index + (j - j0)
            for (std::size_t k = k0; k < k1; ++k) index[k - k0] = changed[k] + shift;
            if (at > 0 && index[0] <= index[-1]) r.sorted = false;
            W* old_out = reinterpret_cast<W*>(r.old_bytes.data()) + at;
            W* new_out = reinterpret_cast<W*>(r.new_bytes.data()) + at;
            if (gathered) {
              std::memcpy(old_out, gathered_old + k0, (k1 - k0) * sizeof(W));
              std::memcpy(new_out, gathered_new + k0, (k1 - k0) * sizeof(W));
            } else {
              for (std::size_t k = k0; k < k1; ++k) {
                old_out[k - k0] = tracker_words[changed[k]];
                new_out[k - k0] = candidate_words[changed[k]];
              }
            }
          });
        });
      },
      task.mapping);
}

DCR_INLINE void owner::check_projected(std::size_t i) const {
  const projected_changes& p = projected_[i];
  if (!p.valid) return;
  const std::size_t n = changed_[i].size(), parts = tasks_[i].targets.size();
  bool ok = p.index.size() == n && (p.part.size() == n || (parts == 1 && p.part.empty()));
  for (std::size_t k = 0; ok && k < p.part.size(); ++k) ok = p.part[k] < parts;
  DCR_EXPECTS(ok, errc::invalid_argument,
              "owner: detect backend '" + detector_->device() + "' projected task '" +
                  tasks_[i].shard_name + "' inconsistently (" + std::to_string(p.index.size()) +
                  " indices, " + std::to_string(p.part.size()) + " parts for " + std::to_string(n) +
                  " changes)");
}

DCR_INLINE void owner::check_inputs(std::span<const std::span<const std::byte>> shards,
                                    const char* what) const {
  DCR_EXPECTS(shards.size() == tasks_.size(), errc::invalid_argument,
              std::string("owner::") + what + ": expected " + std::to_string(tasks_.size()) +
                  " shards, got " + std::to_string(shards.size()));
  for (std::size_t i = 0; i < tasks_.size(); ++i)
    DCR_EXPECTS(shards[i].size() == tasks_[i].bytes(), errc::shape_mismatch,
                std::string("owner::") + what + ": shard '" + tasks_[i].shard_name + "' has " +
                    std::to_string(shards[i].size()) + " bytes, expected " +
                    std::to_string(tasks_[i].bytes()));
}

DCR_INLINE void owner::check_residual_inputs(std::span<const std::span<const std::byte>> inputs,
                                             const char* what) const {
  DCR_EXPECTS(inputs.size() == residual_input_count_, errc::invalid_argument,
              std::string("owner::") + what + ": expected " +
                  std::to_string(residual_input_count_) + " residual inputs, got " +
                  std::to_string(inputs.size()));
  for (std::size_t r = 0; r < residual_.size(); ++r) {
    const auto& task = residual_[r];
    for (std::size_t k = 0; k < task.inputs.size(); ++k) {
      const auto bytes = inputs[residual_state_[r].first_input + k].size();
      DCR_EXPECTS(bytes == task.inputs[k].bytes(), errc::shape_mismatch,
                  std::string("owner::") + what + ": residual task '" + task.name + "' input '" +
                      task.inputs[k].name + "' has " + std::to_string(bytes) + " bytes, expected " +
                      std::to_string(task.inputs[k].bytes()));
    }
  }
}

DCR_INLINE std::uint32_t pack_payloads(const tensor_registry& registry,
                                       const payload_header& header_template,
                                       std::span<const item> items, std::size_t bucket_bytes,
                                       payload_encoder& encoder,
                                       std::vector<std::vector<std::byte>>& out,
                                       std::vector<payload_id>* ids) {
  out.clear();
  if (ids != nullptr) ids->clear();
  std::size_t begin = 0;
  payload_header h = header_template;
  while (begin < items.size()) {
    const std::size_t end = begin + detail::bucket_item_count(items.subspan(begin), bucket_bytes);
    out.emplace_back();
    encoder.encode(h, items.subspan(begin, end - begin), registry, out.back());
    if (ids != nullptr) ids->push_back(h.id);
    ++h.id.sequence;
    begin = end;
  }
  return h.id.sequence;
}

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
