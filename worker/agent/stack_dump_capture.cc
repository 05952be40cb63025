#include "worker/agent/stack_dump_capture.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace loom::worker {

bool StackDumpCapture::OnLine(std::string_view line) {
  if (!capturing) {
    if (line.substr(0, kStackDumpBegin.size()) != kStackDumpBegin) return false;
    capturing = true;
  }
  if (text.size() < kMaxStackDumpBytes) {
    text.append(line.substr(0, kMaxStackDumpBytes - text.size()));
    if (text.size() < kMaxStackDumpBytes) text.push_back('\n');
  }
  return line.substr(0, kStackDumpEnd.size()) == kStackDumpEnd;
}

std::string ProcState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return "?";
  // "pid (comm) S ...": the command may hold spaces and parentheses, so look after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return "?";
  return std::string(1, stat[close + 2]);
}

}  // namespace loom::worker
