#include "common/ready_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

absl::Status ErrnoError(std::string_view what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(std::string(what), " ", path, ": ", std::strerror(err));
  return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
}

absl::Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteReadyFile(const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& fields) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : fields) j[k] = v;
  // `replace` turns invalid UTF-8 into U+FFFD instead of throwing.
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";

  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp, errno);
  absl::Status status = WriteAll(fd, text, tmp);
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError("cannot fsync", tmp, errno);
  if (::close(fd) != 0 && status.ok()) status = ErrnoError("cannot close", tmp, errno);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError("cannot rename the temp file onto", path, errno);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // fsync the directory so the rename itself survives a crash.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError("cannot open the directory", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) return ErrnoError("cannot fsync the directory", dir, err);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> ReadReadyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError("cannot open", path, errno);
  std::stringstream buf;
  buf << in.rdbuf();
  const nlohmann::json j =
      nlohmann::json::parse(buf.str(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("ready file ", path, " is not a JSON object"));
  }
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ready file ", path, ": field \"", k, "\" is not a string"));
    }
    out[k] = v.get<std::string>();
  }
  return out;
}

}  // namespace loom
