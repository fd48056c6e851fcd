// dcr/commit/memory.hpp: an in-memory commit store (tests, `dcr simulate`). Thread-safe.
#pragma once

#include <mutex>
#include <optional>

#include "dcr/commit/concept.hpp"

namespace dcr {

class memory_commit_store {
 public:
  using commit_store_concept = commit_store_tag;

  std::optional<commit_record> read() const {
    std::lock_guard lock(mutex_);
    return record_;
  }

  bool compare_and_set(const std::optional<commit_record>& expected,
                       const commit_record& desired) {
    std::lock_guard lock(mutex_);
    if (record_ != expected) return false;
    record_ = desired;
    return true;
  }

 private:
  mutable std::mutex mutex_;
  std::optional<commit_record> record_;
};

static_assert(commit_store<memory_commit_store>);

}  // namespace dcr
