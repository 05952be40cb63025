#include "common/echo.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom {

std::string Echo(absl::string_view input) {
  const absl::string_view shown = input.substr(0, kMaxEchoBytes);
  std::string out = "\"";
  for (const char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", byte));
    } else if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, c));
    } else {
      out.push_back(c);
    }
  }
  if (shown.size() < input.size()) {
    absl::StrAppend(&out, "...\" (", input.size(), " bytes)");
  } else {
    out.push_back('"');
  }
  return out;
}

}  // namespace loom
