// End-to-end property tests: every delta refit leaves every receiver bit-identical to a dense
// refit of the same weights through the same engine loader, over randomized trainer and
// receiver layouts, dtypes, change rates and special bit patterns; bad payloads change nothing;
// failed attempts are repaired by overwrite retries.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "dcr/protocol/plane/memory_control_plane.hpp"
#include "dcr/protocol/records.hpp"
#include "dcr/sim/deployment.hpp"
#include "dcr/sim/rank_owner.hpp"

namespace {

using dcr::sim::in_process_deployment;

int seeds_from_env(int fallback) {
  const char* s = std::getenv("DCR_TEST_SEEDS");
  return s ? std::max(1, std::atoi(s)) : fallback;
}

dcr::sim::moe_config tiny_model(dcr::sim::rng& g, dcr::dtype type) {
  dcr::sim::moe_config c;
  c.type = type;
  c.hidden = 8 + static_cast<std::int64_t>(g.next() % 5) * 8 + static_cast<std::int64_t>(g.next() % 3);
  c.kv_dim = 1 + static_cast<std::int64_t>(g.next() % 9);
  c.dense_ffn = 5 + static_cast<std::int64_t>(g.next() % 40);
  c.expert_ffn = 1 + static_cast<std::int64_t>(g.next() % 12);
  c.experts = 1 + static_cast<std::int64_t>(g.next() % 7);
  c.layers = 2 + static_cast<std::int64_t>(g.next() % 2);
  c.vocab = 3 + static_cast<std::int64_t>(g.next() % 60);
  return c;
}

// Words that float equality mishandles: zeros of both signs, NaNs with payloads, infinities,
// subnormals.
template <class W>
std::vector<W> special_words(dcr::dtype t) {
  if constexpr (sizeof(W) == 2) {
    if (t == dcr::dtype::bf16) return {0x0000, 0x8000, 0x7fc0, 0x7fc1, 0xffc3, 0x7f81, 0x7f80, 0xff80, 0x0001, 0x807f};
    return {0x0000, 0x8000, 0x7e00, 0x7e01, 0xfe03, 0x7c01, 0x7c00, 0xfc00, 0x0001, 0x83ff};
  } else {
    return {0x00000000u, 0x80000000u, 0x7fc00000u, 0x7fc00001u, 0xffc12345u, 0x7f800001u,
            0x7f800000u, 0xff800000u, 0x00000001u, 0x807fffffu};
  }
}

// Overwrites `count` random words of random shards with special patterns.
void inject_specials(dcr::sim::synthetic_trainer& trainer, dcr::sim::rng& g, int count) {
  const auto type = trainer.config().type;
  for (int k = 0; k < count; ++k) {
    const std::size_t shard = g.next() % trainer.shards().size();
    auto words = trainer.mutable_words(shard);
    if (words.empty()) continue;
    dcr::visit_word(dcr::dtype_size(type), [&](auto w) {
      using W = decltype(w);
      if constexpr (sizeof(W) == 2 || sizeof(W) == 4) {
        const auto specials = special_words<W>(type);
        auto* p = reinterpret_cast<W*>(words.data());
        p[g.next() % (words.size() / sizeof(W))] = specials[g.next() % specials.size()];
      }
    });
  }
}

// Deep copy of every receiver's storage, to prove a rejected payload changed nothing.
std::vector<dcr::sim::moe_engine_storage> snapshot(in_process_deployment& d) {
  std::vector<dcr::sim::moe_engine_storage> s;
  for (std::size_t r = 0; r < d.receiver_count(); ++r) s.push_back(d.storage_at(r));
  return s;
}
void check_unchanged(in_process_deployment& d, const std::vector<dcr::sim::moe_engine_storage>& s) {
  for (std::size_t r = 0; r < d.receiver_count(); ++r) REQUIRE(d.storage_at(r).first_difference(s[r]) == "");
}

dcr::sim::deployment_options small_options(dcr::dtype type = dcr::dtype::bf16) {
  dcr::sim::deployment_options o;
  o.model = dcr::sim::moe_config{};  // hidden 64, 2 layers, 8 experts
  o.model.type = type;
  o.trainer_tp = 2;
  o.trainer_dp = 2;
  o.receiver_tp = 4;
  return o;
}

}  // namespace

TEST_CASE("delta refit equals dense refit across layouts, dtypes, change rates and specials") {
  const int seeds = seeds_from_env(500);
  const int tps[] = {1, 2, 4, 8};
  const dcr::dtype types[] = {dcr::dtype::bf16, dcr::dtype::f16, dcr::dtype::f32};
  const double rates[] = {0.0, 0.001, 0.01, 1.0, 0.01};
  for (int seed = 1; seed <= seeds; ++seed) {
    dcr::sim::rng g(static_cast<std::uint64_t>(seed) * 7919);
    dcr::sim::deployment_options o;
    o.model = tiny_model(g, types[g.next() % 3]);
    o.trainer_tp = tps[g.next() % 4];
    o.trainer_dp = 1 + static_cast<int>(g.next() % 4);
    o.receiver_tp = tps[g.next() % 4];
    o.seed = static_cast<std::uint64_t>(seed);
    CAPTURE(seed);
    CAPTURE(o.trainer_tp);
    CAPTURE(o.trainer_dp);
    CAPTURE(o.receiver_tp);
    CAPTURE(std::string(dcr::dtype_name(o.model.type)));
    in_process_deployment d(o);
    inject_specials(d.trainer(), g, 20);
    d.start();
    REQUIRE(d.verify_against_dense_refit() == "");  // the initial dense load itself
    for (double rate : rates) {
      CAPTURE(rate);
      d.trainer().stress_step(rate);
      inject_specials(d.trainer(), g, 10);
      dcr::refit_options ro;
      ro.policy = (g.next() % 3 == 0) ? dcr::encoding_policy::overwrite_only : dcr::encoding_policy::mixed;
      ro.bucket_bytes = 1 + g.next() % 4096;  // many small payloads as well as single ones
      const auto report = d.refit(ro);
      REQUIRE(report.committed);
      REQUIRE(report.attempts.size() == 1);
      REQUIRE(d.verify_against_dense_refit() == "");
    }
    CHECK(d.version() == 5);
  }
}

TEST_CASE("a refit with no changes sends no records and keeps every receiver exact") {
  in_process_deployment d(small_options());
  d.start();
  const auto report = d.refit();
  REQUIRE(report.committed);
  CHECK(report.attempts[0].records == 0);
  CHECK(report.attempts[0].owners.changed_elements == 0);
  CHECK(d.verify_against_dense_refit() == "");
}

TEST_CASE("commit cleanup erases only the reports and acks dcr spelled; other keys stay") {
  in_process_deployment d(small_options());
  d.start();
  // Keys under the protocol's prefixes that dcr never writes (another tool's, or damaged ones):
  // the cleanup after a commit must neither choke on them nor erase them.
  const std::vector<std::string> foreign = {"/dcr/reports/junk", "/dcr/reports/t1-x/0",
                                            "/dcr/acks/t0-1", "/dcr/acks/-",
                                            "/dcr/acks/t0-1-a0x/receiver-0"};
  for (const auto& k : foreign) dcr::put(d.plane(), k, "not ours");
  const auto report = d.refit();
  REQUIRE(report.committed);
  CHECK(d.verify_against_dense_refit() == "");
  std::vector<std::string> left;
  for (const char* prefix : {"/dcr/reports/", "/dcr/acks/"})
    for (const auto& r : d.plane().list(prefix)) left.push_back(r.key);
  std::sort(left.begin(), left.end());
  auto want = foreign;
  std::sort(want.begin(), want.end());
  CHECK(left == want);  // the committed transition's own reports and acks are gone
}

TEST_CASE("bad payloads are refused with a clear error and leave storage bit-identical") {
  in_process_deployment d(small_options());
  d.start();
  d.trainer().stress_step(0.05);
  // Attempt 0 is published, but every receiver drops out before applying anything, and no retry
  // is allowed: its payloads stay in the transport, uncommitted.
  dcr::refit_options once;
  once.max_attempts = 1;
  once.bucket_bytes = 2048;
  const auto report = d.refit(once, [](std::uint32_t, std::size_t, std::uint64_t) {
    return dcr::testing::delivery_fault::drop;
  });
  REQUIRE_FALSE(report.committed);
  const dcr::attempt_key key{0, 1, 0};
  std::vector<dcr::payload_id> ids;
  for (const auto& l : d.store().list(key)) ids.insert(ids.end(), l.ids.begin(), l.ids.end());
  REQUIRE(ids.size() >= 2);
  std::vector<std::byte> payload;
  REQUIRE(d.store().get(ids[0], payload) == dcr::get_status::found);
  auto& rx = d.receiver_at(0);
  rx.begin_attempt(key);
  const auto before = snapshot(d);

  auto expect_error = [&](std::span<const std::byte> bytes, const char* what) {
    CAPTURE(what);
    try {
      rx.apply_payload(bytes);
      FAIL("accepted a bad payload");
    } catch (const dcr::error& e) {
      CHECK(std::string(e.what()).size() > 10);  // says what and where
    }
    check_unchanged(d, before);
  };

  SUBCASE("flipped bits anywhere") {
    for (std::size_t at = 0; at < payload.size(); at += 1 + payload.size() / 97) {
      auto bad = payload;
      bad[at] ^= std::byte{0x04};
      expect_error(bad, "flipped bit");
    }
  }
  SUBCASE("truncated") {
    for (std::size_t len : {std::size_t{0}, std::size_t{7}, payload.size() / 2, payload.size() - 1})
      expect_error(std::span<const std::byte>(payload.data(), len), "truncated");
  }
  SUBCASE("another transition or a fenced attempt") {
    rx.begin_attempt({5, 6, 0});
    expect_error(payload, "other transition");
    rx.begin_attempt({0, 1, 1});  // attempt 0 is fenced once attempt 1 began
    expect_error(payload, "fenced attempt");
  }
  SUBCASE("duplicated delivery is dropped") {
    CHECK(rx.apply_payload(payload) == dcr::apply_outcome::applied);
    const auto after_first = snapshot(d);
    CHECK(rx.apply_payload(payload) == dcr::apply_outcome::duplicate);
    check_unchanged(d, after_first);
    CHECK(rx.stats().duplicates_dropped == 1);
  }
  SUBCASE("a payload for another model") {
    auto other_options = small_options();
    other_options.model.hidden = 32;
    in_process_deployment other(other_options);
    other.start();
    other.trainer().stress_step(0.05);
    REQUIRE(other.refit(once, [](std::uint32_t, std::size_t, std::uint64_t) {
                   return dcr::testing::delivery_fault::drop;
                 }).committed == false);
    std::vector<std::byte> foreign;
    const auto listing = other.store().list(key);
    REQUIRE_FALSE(listing.empty());
    REQUIRE(other.store().get(listing.at(0).ids.at(0), foreign) == dcr::get_status::found);
    expect_error(foreign, "other model");
  }
}

TEST_CASE("a failed attempt is repaired by an overwrite retry; duplicates and corruption are survived") {
  using dcr::testing::delivery_fault;
  // lose: the source loses the delivery and still reports the attempt complete (a transport
  // bug), so the receiver acknowledges `applied` with a payload missing; the coordinator
  // compares what each receiver applied with the owners' manifests and fails the attempt
  // instead of committing a non-dense result.
  for (auto action : {delivery_fault::drop, delivery_fault::lose, delivery_fault::duplicate,
                      delivery_fault::corrupt}) {
    CAPTURE(static_cast<int>(action));
    in_process_deployment d(small_options());
    d.start();
    d.trainer().stress_step(0.03);
    dcr::refit_options ro;
    ro.bucket_bytes = 1024;
    // Receiver 1 gets the fault at its third payload of attempt 0; earlier payloads were applied
    // (xor records), so a dropped receiver holds a partial transition until the retry.
    const auto report = d.refit(ro, [&](std::uint32_t attempt, std::size_t r, std::uint64_t k) {
      return attempt == 0 && r == 1 && k == 2 ? action : delivery_fault::none;
    });
    REQUIRE(report.committed);
    if (action == delivery_fault::drop || action == delivery_fault::lose) {
      REQUIRE(report.attempts.size() == 2);
      CHECK_FALSE(report.attempts[0].succeeded);
      CHECK(report.attempts[1].policy == dcr::encoding_policy::overwrite_only);
      if (action == delivery_fault::lose)
        CHECK(report.attempts[0].failure.find("the owners' manifests list") != std::string::npos);
    } else {
      REQUIRE(report.attempts.size() == 1);
    }
    if (action == delivery_fault::duplicate) CHECK(report.attempts[0].duplicates_dropped == 1);
    if (action == delivery_fault::corrupt) CHECK(report.attempts[0].corrupt_refetched == 1);
    CHECK(d.verify_against_dense_refit() == "");
    // The next transition builds on the committed baseline and stays exact.
    d.trainer().stress_step(0.03);
    REQUIRE(d.refit().committed);
    CHECK(d.verify_against_dense_refit() == "");
  }
}

TEST_CASE("a coordinator whose commit record moved mid-transition loses the compare-and-set") {
  in_process_deployment d(small_options());
  d.start();
  d.trainer().stress_step(0.01);
  bool moved = false;
  std::mutex moving;  // the fault plan is called from every receiver's thread
  try {
    // Another coordinator (a failover) commits version 1 while this one is delivering.
    (void)d.refit({}, [&](std::uint32_t, std::size_t, std::uint64_t) {
      std::lock_guard lock(moving);
      if (!moved) {
        const dcr::protocol_keys keys;
        auto record = d.plane().get(keys.commit());
        auto other = dcr::decode_record<dcr::commit_record>(keys.commit(), record->value);
        other.version = 1;
        other.attempt = 9;
        REQUIRE(dcr::put_if(d.plane(), keys.commit(), dcr::encode_record(other), record->revision));
        moved = true;
      }
      return dcr::testing::delivery_fault::none;
    });
    FAIL("commit succeeded against a moved record");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == dcr::errc::commit_conflict);
  }
  const auto record = d.plane().get(dcr::protocol_keys{}.commit());
  CHECK(dcr::decode_record<dcr::commit_record>("commit", record->value).attempt == 9);
}

TEST_CASE("payload bytes scale with changes, far below the checkpoint") {
  in_process_deployment d(small_options());
  d.start();
  d.trainer().stress_step(0.01);
  const auto r1 = d.refit();
  d.trainer().stress_step(0.2);
  const auto r20 = d.refit();
  REQUIRE(r1.committed);
  REQUIRE(r20.committed);
  const auto checkpoint = static_cast<std::uint64_t>(d.registry().total_bytes());
  CHECK(r1.attempts[0].payload_bytes < checkpoint / 10);
  CHECK(r20.attempts[0].payload_bytes > 3 * r1.attempts[0].payload_bytes);
  CHECK(d.verify_against_dense_refit() == "");
}

TEST_CASE("pack_payloads: one sequence counter, the ids it reports are the ids in the bytes") {
  std::vector<dcr::canonical_tensor> tensors;
  for (int k = 0; k < 5; ++k) tensors.push_back({"t" + std::to_string(k), dcr::dtype::bf16, {64}});
  const dcr::tensor_registry registry(tensors);
  std::vector<dcr::item> items;
  for (dcr::tensor_id t = 0; t < 5; ++t) {
    std::vector<std::uint64_t> index(40);
    for (std::size_t i = 0; i < index.size(); ++i) index[i] = i;
    const std::vector<std::uint16_t> before(40, 0x3f80), after(40, static_cast<std::uint16_t>(0x3f81 + t));
    items.push_back(dcr::make_item<std::uint16_t>(t, dcr::dtype::bf16, dcr::encoding::overwrite,
                                                  index, before, after));
  }
  dcr::payload_header header;
  header.id = {dcr::attempt_key{4, 5, 2}, 3, 7};  // an attempt's later chunk starts at 7
  header.registry_fingerprint = registry.fingerprint();
  dcr::payload_encoder encoder;
  std::vector<std::vector<std::byte>> out;
  std::vector<dcr::payload_id> ids;
  // 40 records of 10 raw bytes per item: two items a payload at 800 bytes.
  const std::uint32_t next = dcr::pack_payloads(registry, header, items, 800, encoder, out, &ids);
  REQUIRE(out.size() == 3);
  REQUIRE(ids.size() == 3);
  CHECK(next == 10);
  dcr::payload_decoder decoder;
  std::vector<dcr::item> got;
  for (std::size_t k = 0; k < out.size(); ++k) {
    const auto h = decoder.decode(out[k], registry, got);
    CHECK(h.id == ids[k]);
    CHECK(ids[k].sequence == 7 + k);
    CHECK(ids[k].owner == 3);
  }
  // Nothing to pack: no payload, and the sequence stays where it was.
  CHECK(dcr::pack_payloads(registry, header, {}, 800, encoder, out, &ids) == 7);
  CHECK(out.empty());
  CHECK(ids.empty());
}

TEST_CASE("owner::build_payloads on several threads gives the one-thread loop's bytes and state") {
  // dcr simulate's layout at a small size: several affine chunks and residual (fused QKV) chunks.
  const auto config = dcr::sim::moe_config::for_bytes(std::uint64_t{12} << 20, dcr::dtype::bf16);
  const dcr::tensor_registry registry(config.canonical_tensors());
  const std::uint32_t rank = 1;
  dcr::sim::synthetic_trainer trainer(config, registry, 2, 2, 1, dcr::sim::trainer_layout::megatron,
                                      dcr::sim::trainer_selection::owned_by(rank));
  const dcr::sim::stress_schedule schedule(0.02);
  const auto loop_owner = dcr::sim::make_rank_owner(registry, trainer, rank);
  const auto pool_owner = dcr::sim::make_rank_owner(registry, trainer, rank);
  std::vector<std::span<const std::byte>> cand, inputs;
  trainer.advance_to(0, schedule);
  loop_owner.spans(trainer, cand, inputs);
  for (const auto* o : {&loop_owner, &pool_owner}) {
    o->owner->set_chunk_bytes(std::size_t{64} << 10);  // many chunks
    o->owner->initialize(cand, inputs);
  }
  REQUIRE(loop_owner.owner->chunk_count() > 4);
  REQUIRE(!loop_owner.owner->residual_tasks().empty());

  dcr::payload_header header;
  header.registry_fingerprint = registry.fingerprint();
  for (std::uint64_t step = 1; step <= 2; ++step) {
    trainer.advance_to(step, schedule);
    loop_owner.spans(trainer, cand, inputs);
    // Two attempts of the transition: mixed, then an overwrite-only retry (the union path).
    for (std::uint32_t attempt = 0; attempt < 2; ++attempt) {
      const auto policy =
          attempt == 0 ? dcr::encoding_policy::mixed : dcr::encoding_policy::overwrite_only;
      header.id = dcr::payload_id{{step - 1, step, attempt}, rank, 3};
      std::vector<std::vector<std::byte>> expected, out;
      std::vector<dcr::payload_id> expected_ids, ids;
      dcr::payload_encoder encoder;
      dcr::payload_header h = header;
      std::uint64_t records = 0;
      for (std::size_t k = 0; k < loop_owner.owner->chunk_count(); ++k) {
        const auto& items = loop_owner.owner->build_chunk(k, cand, policy, inputs);
        for (const auto& it : items) records += it.count();
        h.id.sequence = dcr::pack_payloads(registry, h, items, 4096, encoder, out, &ids);
        expected.insert(expected.end(), out.begin(), out.end());
        expected_ids.insert(expected_ids.end(), ids.begin(), ids.end());
      }
      REQUIRE(expected.size() > 2);
      for (std::size_t threads : {1, 2, 3}) {
        CAPTURE(step);
        CAPTURE(attempt);
        CAPTURE(threads);
        std::vector<dcr::payload_encoder> encoders(threads);
        dcr::build_payloads_summary summary;
        const std::uint32_t next = pool_owner.owner->build_payloads(
            cand, policy, inputs, {}, dcr::build_mode::changes, header, 4096, encoders, out, &ids,
            &summary);
        CHECK(next == h.id.sequence);
        CHECK(summary.records == records);
        CHECK(summary.build_seconds > 0);
        CHECK(out == expected);
        CHECK(ids == expected_ids);
        CHECK(pool_owner.owner->change_digest() == loop_owner.owner->change_digest());
        const auto& a = loop_owner.owner->stats();
        const auto& b = pool_owner.owner->stats();
        CHECK(a.changed_elements == b.changed_elements);
        CHECK(a.compared_bytes == b.compared_bytes);
        CHECK(a.items == b.items);
        CHECK(a.residual_items == b.residual_items);
        CHECK(a.residual_changed_elements == b.residual_changed_elements);
      }
    }
    loop_owner.owner->commit(cand, inputs);
    pool_owner.owner->commit(cand, inputs);
    for (std::size_t i = 0; i < loop_owner.owner->tasks().size(); ++i) {
      const auto x = loop_owner.owner->tracker(i), y = pool_owner.owner->tracker(i);
      CHECK(std::equal(x.begin(), x.end(), y.begin(), y.end()));
    }
    for (std::size_t r = 0; r < loop_owner.owner->residual_tasks().size(); ++r)
      for (std::size_t o = 0; o < loop_owner.owner->residual_tasks()[r].outputs.size(); ++o) {
        const auto x = loop_owner.owner->residual_baseline(r, o);
        const auto y = pool_owner.owner->residual_baseline(r, o);
        CHECK(std::equal(x.begin(), x.end(), y.begin(), y.end()));
      }
  }
}

TEST_CASE("owner::build_payloads needs an encoder and leaves a failed attempt unbuilt") {
  const auto config = dcr::sim::moe_config::for_bytes(std::uint64_t{2} << 20, dcr::dtype::bf16);
  const dcr::tensor_registry registry(config.canonical_tensors());
  dcr::sim::synthetic_trainer trainer(config, registry, 2, 2, 1, dcr::sim::trainer_layout::megatron,
                                      dcr::sim::trainer_selection::owned_by(0));
  const auto built = dcr::sim::make_rank_owner(registry, trainer, 0);
  std::vector<std::span<const std::byte>> cand, inputs;
  built.spans(trainer, cand, inputs);
  built.owner->initialize(cand, inputs);
  dcr::payload_header header;
  header.registry_fingerprint = registry.fingerprint();
  std::vector<std::vector<std::byte>> out;
  CHECK_THROWS_AS(built.owner->build_payloads(cand, dcr::encoding_policy::mixed, inputs, {},
                                              dcr::build_mode::changes, header, 4096, {}, out),
                  dcr::error);
  // A payload that cannot be encoded (wrong registry fingerprint) fails on a worker thread: the
  // error reaches the caller and nothing is committable.
  trainer.stress_step(0.05);
  built.spans(trainer, cand, inputs);
  header.registry_fingerprint = registry.fingerprint() + 1;
  std::vector<dcr::payload_encoder> encoders(2);
  CHECK_THROWS_AS(built.owner->build_payloads(cand, dcr::encoding_policy::mixed, inputs, {},
                                              dcr::build_mode::changes, header, 4096, encoders,
                                              out),
                  dcr::error);
  CHECK_THROWS_AS(built.owner->commit(cand, inputs), dcr::error);
}

TEST_CASE("an owner holding several shards of one tensor sends its records sorted, word for word") {
  // Two column shards of w in one owner, the second rank's first: the record buffer of w gets
  // rank 1's columns, then rank 0's, and must come out sorted with the words moved along. Two row
  // shards of v, in order (no sort needed). Four transitions with fresh changes each, a retry in
  // one from candidates that changed further, so buffers handed from build to build carry the
  // right words.
  const dcr::tensor_registry reg({{"w", dcr::dtype::bf16, {6, 8}}, {"v", dcr::dtype::bf16, {6, 8}}});
  const auto w = reg.id("w"), v = reg.id("v");
  const std::vector<std::int64_t> shape = {6, 8};
  std::vector<dcr::affine_task> tasks;
  const auto add = [&](std::string name, dcr::any_mapping m, dcr::tensor_id target) {
    dcr::affine_task t;
    t.shard_name = std::move(name);
    t.mapping = m;
    t.targets = {target};
    tasks.push_back(t);
  };
  for (int r : {1, 0}) add("w.col" + std::to_string(r), dcr::column_split(shape, 2, r), w);
  for (int r : {0, 1}) add("v.row" + std::to_string(r), dcr::row_split(shape, 2, r), v);
  dcr::owner o(reg, 0, tasks, {});
  dcr::sim::rng g(11);
  // Canonical words of both tensors; each shard is cut from them through its own mapping.
  std::vector<std::uint16_t> committed(96), candidate(96);
  for (auto& x : committed) x = static_cast<std::uint16_t>(g.next());
  std::vector<std::vector<std::uint16_t>> shards(tasks.size());
  std::vector<std::span<const std::byte>> spans(tasks.size());
  const auto cut = [&](const std::vector<std::uint16_t>& canonical) {
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      const auto base = tasks[i].targets[0] == w ? 0 : 48;
      shards[i].resize(dcr::local_size(tasks[i].mapping));
      for (std::uint64_t j = 0; j < shards[i].size(); ++j)
        shards[i][j] = canonical[base + std::visit([&](const auto& m) { return m(j).index; },
                                                   tasks[i].mapping)];
      spans[i] = std::as_bytes(std::span<const std::uint16_t>(shards[i]));
    }
  };
  cut(committed);
  o.initialize(spans);
  for (int step = 1; step <= 4; ++step) {
    CAPTURE(step);
    candidate = committed;
    for (int k = 0; k < 30; ++k) candidate[g.next() % 96] ^= static_cast<std::uint16_t>(1 + g.next() % 0xffff);
    cut(candidate);
    for (int attempt = 0; attempt < (step == 2 ? 2 : 1); ++attempt) {
      if (attempt == 1) {  // a retry from candidates that changed further: the union is sent
        for (int k = 0; k < 10; ++k) {
          const std::size_t x = g.next() % 96;
          if (candidate[x] == committed[x]) candidate[x] ^= 0x0101;
        }
        cut(candidate);
      }
      const auto& items = o.build_items(spans, dcr::encoding_policy::overwrite_only);
      std::size_t changed = 0;
      for (std::size_t x = 0; x < 96; ++x) changed += committed[x] != candidate[x] ? 1 : 0;
      std::size_t records = 0;
      for (const auto& it : items) {
        const std::size_t base = it.tensor == w ? 0 : 48;
        REQUIRE(it.enc == dcr::encoding::overwrite);
        REQUIRE(std::is_sorted(it.indices.begin(), it.indices.end()));
        REQUIRE(std::adjacent_find(it.indices.begin(), it.indices.end()) == it.indices.end());
        const auto words = it.words<std::uint16_t>();
        for (std::size_t k = 0; k < it.count(); ++k) {
          CAPTURE(it.indices[k]);
          CHECK(words[k] == candidate[base + it.indices[k]]);
          CHECK(committed[base + it.indices[k]] != candidate[base + it.indices[k]]);
        }
        records += it.count();
      }
      CHECK(records == changed);
    }
    o.commit(spans);
    committed = candidate;
  }
}
