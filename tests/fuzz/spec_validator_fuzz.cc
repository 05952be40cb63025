// Fuzz target: loomd's job spec validator (server/jobs/spec_validator.cc) on a JobSpec parsed
// from the input, as CreateJob receives it. The input is the spec in the proto's JSON mapping
// when it starts with '{' (what loomctl sends, after YAML), else protobuf wire bytes (what any
// gRPC client can send); the cluster's capacity comes from the input's last bytes. Contracts
// (spec_validator.h): never a crash; an accepted spec's layout multiplies to its devices and
// fits the cluster; validating the validated spec gives the same spec and layout back. Under
// libFuzzer the inputs are mutated as JobSpecs (proto_mutator.h), not only as bytes.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "loom/v1/job.pb.h"
#include "server/jobs/spec_validator.h"
#ifdef LOOM_FUZZ_ENGINE
#include "tests/fuzz/proto_mutator.h"
#endif

namespace {

// The operator's roots, as a loomd with --data-roots and --checkpoint-roots has them (loomd
// never opens the files: no file system is involved).
loom::jobs::SpecPolicy Policy() {
  loom::jobs::SpecPolicy policy;
  policy.data_roots = {"/data", "/shared/datasets"};
  policy.checkpoint_roots = {"/shared/checkpoints"};
  return policy;
}

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "spec_validator_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

// Parsing fuzzed wire bytes logs every string field that is not UTF-8; quiet, for speed.
static google::protobuf::LogSilencer quiet_protobuf;

#ifdef LOOM_FUZZ_ENGINE
// The input is the spec followed by the 5 bytes FuzzedDataProvider reads the capacity from (it
// consumes integers from the end): mutate the spec as a JobSpec, keep the capacity.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  return loom::fuzz::MutateProtoInput<loom::v1::JobSpec>(data, size, max_size, seed, 5);
}
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  loom::jobs::ClusterCapacity capacity;
  capacity.gpu.max_per_node = in.ConsumeIntegralInRange(0, 16);
  capacity.gpu.total = capacity.gpu.max_per_node * in.ConsumeIntegralInRange(0, 64);
  capacity.cpu.max_per_node = in.ConsumeIntegralInRange(0, 64);
  capacity.cpu.total = capacity.cpu.max_per_node * in.ConsumeIntegralInRange(0, 16);
  capacity.ready_nodes = in.ConsumeIntegralInRange(0, 64);
  const std::string text = in.ConsumeRemainingBytesAsString();

  loom::v1::JobSpec spec;
  if (!text.empty() && text[0] == '{') {
    if (!google::protobuf::util::JsonStringToMessage(text, &spec).ok()) return 0;
  } else if (!spec.ParseFromString(text)) {
    return 0;
  }
  static const loom::jobs::SpecPolicy files = Policy();
  absl::StatusOr<loom::jobs::ValidatedSpec> first = ValidateJobSpec(spec, capacity, files);
  if (!first.ok()) {
    if (first.status().message().empty()) Fail("an error without a message");
    return 0;
  }
  const loom::v1::Layout& l = first->layout;
  if (first->devices <= 0 ||
      int64_t{l.data()} * l.tensor() * l.pipeline() != int64_t{first->devices}) {
    Fail("an accepted layout that does not multiply to the devices");
  }
  absl::StatusOr<loom::jobs::ValidatedSpec> again = ValidateJobSpec(first->spec, capacity, files);
  if (!again.ok()) {
    std::fprintf(stderr, "the validated spec is refused: %s\n",
                 std::string(again.status().message()).c_str());
    Fail("validation is not idempotent");
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(first->spec, again->spec) ||
      !google::protobuf::util::MessageDifferencer::Equals(first->layout, again->layout)) {
    std::fprintf(stderr, "first:\n%s\nagain:\n%s\n", first->spec.DebugString().c_str(),
                 again->spec.DebugString().c_str());
    Fail("validating the validated spec changed it");
  }
  return 0;
}
