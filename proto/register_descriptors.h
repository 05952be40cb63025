// Eager registration of Loom's proto descriptors. loom_proto adds a file's descriptor to
// protobuf's generated pool the first time one of its messages is used, not at program start
// (proto/lazy_descriptors.cmake: it saves every process, loomctl's calls and the ranks, the
// parsing of every descriptor). A lookup by name in the pool (gRPC server reflection, a
// type URL) finds only files already used; a program that serves such lookups calls
// RegisterProtoDescriptors() first.
#pragma once

#include <string>
#include <vector>

namespace loom {

// Adds every proto/loom/v1 file (and its imports) to the generated pool. Idempotent and
// thread-safe (protobuf adds each file once).
void RegisterProtoDescriptors();

// The files RegisterProtoDescriptors() adds, as the pool names them ("loom/v1/job.proto").
const std::vector<std::string>& ProtoFiles();

}  // namespace loom
