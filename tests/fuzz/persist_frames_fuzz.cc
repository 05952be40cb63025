// Fuzz target: the frames on loomctl's persistent-connection socket (client/persist_mux.h). The
// mux decodes requests from other loomctl processes of its user, and loomctl decodes the mux's
// answers. Contract: any bytes give a frame within its bounds or an error, never a crash; a
// decoded frame encodes back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "client/persist_mux.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<loom::client::MuxRequest> request = loom::client::DecodeMuxRequest(frame);
  if (request.ok()) {
    if (request->path.size() > loom::client::kMuxMaxPathBytes ||
        request->token.size() > loom::client::kMuxMaxTokenBytes ||
        request->key.size() > loom::client::kMuxMaxKeyBytes ||
        request->body.size() > loom::client::kMuxMaxRequestBodyBytes ||
        loom::client::EncodeMuxRequest(*request) != frame) {
      std::abort();
    }
  }
  absl::StatusOr<loom::client::MuxAnswer> answer = loom::client::DecodeMuxAnswer(frame);
  if (answer.ok()) {
    if (answer->message.size() > loom::client::kMuxMaxMessageBytes ||
        loom::client::EncodeMuxAnswer(*answer) != frame) {
      std::abort();
    }
  }
  return 0;
}
