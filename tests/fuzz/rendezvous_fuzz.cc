// Fuzz target: loomd's rendezvous store (server/rendezvous/rendezvous_store.cc), driven as the
// RendezvousService drives it, with fuzzed scopes, keys, values and counters. The input is a
// script of operations (FuzzedDataProvider). Besides "no crash", the store is checked against
// a plain map: a value set is the value read, a counter adds up, a wait on keys that are all
// set returns their values at once, and a dropped generation forgets its keys.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "loom/v1/rendezvous.pb.h"
#include "server/rendezvous/rendezvous_store.h"

namespace {

using Model = std::map<std::pair<std::string, int64_t>, std::map<std::string, std::string>>;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "rendezvous_fuzz: %s\n", what.c_str());
  std::abort();
}

loom::v1::RendezvousScope PickScope(FuzzedDataProvider& in) {
  loom::v1::RendezvousScope scope;
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
      scope.set_job("jobs/a");
      break;
    case 1:
      scope.set_job("jobs/b");
      break;
    case 2:
      scope.set_job("jobs/ended");  // the checker refuses it, as loomd does a finished job
      break;
    default:
      scope.set_job(in.ConsumeRandomLengthString(64));
  }
  scope.set_generation(in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 3)
                                        : in.ConsumeIntegral<int64_t>());
  return scope;
}

std::string PickKey(FuzzedDataProvider& in) {
  static const char* const kKeys[] = {"k", "nccl_id", "gloo/0", "counter"};
  if (in.ConsumeBool()) return kKeys[in.ConsumeIntegralInRange(0, 3)];
  return in.ConsumeRandomLengthString(600);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  loom::rendezvous::RendezvousStore store([](std::string_view job, int64_t) {
    return job == "jobs/ended" ? absl::FailedPreconditionError("job ended") : absl::OkStatus();
  });
  Model model;
  for (int op = 0; op < 64 && in.remaining_bytes() > 0; ++op) {
    const loom::v1::RendezvousScope scope = PickScope(in);
    const auto where = std::make_pair(scope.job(), scope.generation());
    switch (in.ConsumeIntegralInRange(0, 4)) {
      case 0: {  // Set
        const std::string key = PickKey(in);
        std::string value = in.ConsumeRandomLengthString(256);
        if (store.Set(scope, key, value).ok()) model[where][key] = value;
        break;
      }
      case 1: {  // Get
        const std::string key = PickKey(in);
        absl::StatusOr<std::string> got = store.Get(scope, key);
        auto scope_it = model.find(where);
        const bool known = scope_it != model.end() && scope_it->second.count(key) > 0;
        if (got.ok() && (!known || *got != scope_it->second.at(key))) Fail("Get != last Set");
        if (!got.ok() && got.status().code() == absl::StatusCode::kNotFound && known) {
          Fail("Get lost a key");
        }
        break;
      }
      case 2: {  // Add
        const std::string key = PickKey(in);
        const int64_t delta = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, 2)
                                               : in.ConsumeIntegral<int64_t>();
        absl::StatusOr<int64_t> sum = store.Add(scope, key, delta);
        if (sum.ok()) {
          auto& values = model[where];
          int64_t before = 0;
          if (values.count(key) > 0 && !absl::SimpleAtoi(values[key], &before)) {
            Fail("Add accepted a value that is not an integer");
          }
          int64_t want = 0;
          if (__builtin_add_overflow(before, delta, &want)) Fail("Add overflowed silently");
          if (*sum != want) Fail("Add returned the wrong sum");
          values[key] = std::to_string(*sum);
          absl::StatusOr<std::string> text = store.Get(scope, key);
          if (!text.ok() || *text != values[key]) Fail("Get after Add");
        }
        break;
      }
      case 3: {  // Wait
        std::vector<std::string> keys(in.ConsumeIntegralInRange(0, 3));
        for (std::string& k : keys) k = PickKey(in);
        bool all_set = model.count(where) > 0;
        for (const std::string& k : keys) all_set = all_set && model[where].count(k) > 0;
        // Short enough that a wait on a missing key costs little; a wait on keys that are
        // set must not wait at all.
        absl::StatusOr<std::vector<std::string>> got =
            store.Wait(scope, keys, absl::Milliseconds(1), nullptr);
        if (got.ok()) {
          if (got->size() != keys.size()) Fail("Wait returned the wrong number of values");
          for (size_t i = 0; i < keys.size(); ++i) {
            if (model[where].count(keys[i]) == 0 || (*got)[i] != model[where][keys[i]]) {
              Fail("Wait returned a value never set");
            }
          }
        } else if (all_set && !keys.empty() &&
                   got.status().code() == absl::StatusCode::kDeadlineExceeded) {
          Fail("Wait timed out on keys that are all set");
        }
        break;
      }
      default: {  // DropJob
        const int64_t keep = in.ConsumeIntegral<int64_t>();
        store.DropJob(scope.job(), keep);
        if (keep > 0) {
          for (auto it = model.begin(); it != model.end();) {
            it = it->first.first == scope.job() && it->first.second < keep ? model.erase(it)
                                                                           : std::next(it);
          }
        }
      }
    }
  }
  store.Shutdown();
  return 0;
}
