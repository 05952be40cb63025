#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <variant>

#include "common/logging.h"

namespace loom::metrics {

// ---------------------------------------------------------------------------------------------
// Metric types.

void Counter::Increment(double by) {
  if (!(by >= 0.0)) return;  // also rejects NaN
  value_.fetch_add(by, std::memory_order_relaxed);
}

double Counter::Value() const { return value_.load(std::memory_order_relaxed); }

void Gauge::Set(double v) { value_.store(v, std::memory_order_relaxed); }
void Gauge::Increment(double by) { value_.fetch_add(by, std::memory_order_relaxed); }
void Gauge::Decrement(double by) { value_.fetch_sub(by, std::memory_order_relaxed); }
double Gauge::Value() const { return value_.load(std::memory_order_relaxed); }

namespace {

std::vector<double> NormalizeBuckets(std::vector<double> buckets) {
  std::erase_if(buckets, [](double b) { return std::isnan(b) || b == HUGE_VAL; });
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  return buckets;
}

}  // namespace

Histogram::Histogram(std::vector<double> buckets)
    : bounds_(NormalizeBuckets(std::move(buckets))),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // Prometheus buckets are "less than or equal": v lands in the first bound >= v.
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    out[i] = running;
  }
  return out;
}

uint64_t Histogram::Count() const { return CumulativeCounts().back(); }

double Histogram::Sum() const { return sum_.load(std::memory_order_relaxed); }

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) out.push_back(b);
  return out;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i) out.push_back(start + width * i);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Registry internals.

struct Registry::Series {
  Labels labels;  // sorted by name, values valid UTF-8
  bool exported = true;
  std::variant<std::unique_ptr<Counter>, std::unique_ptr<Gauge>, std::unique_ptr<Histogram>> metric;
};

struct Registry::Family {
  std::string help;
  Type type;
  std::vector<double> bounds;  // histograms only, normalized
  std::map<Labels, std::unique_ptr<Series>> series;
};

namespace {

const char* TypeName(int type) {
  switch (type) {
    case 0:
      return "counter";
    case 1:
      return "gauge";
    default:
      return "histogram";
  }
}

bool IsValidMetricName(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view s) {
  if (s.empty() || s.starts_with("__")) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Label values often come from input (job and node names). Prometheus rejects a whole scrape
// with invalid UTF-8 in it, so invalid bytes are replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) {
        ok = false;
      } else {
        cp = (cp << 6) | (cc & 0x3F);
      }
    }
    // Reject overlong encodings, surrogates and values beyond U+10FFFF.
    if (ok) {
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += 1;
    }
  }
  return out;
}

// The shortest text that reads back as the same double, in the forms Prometheus parses.
void AppendValue(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out.append(buf, r.ptr);
  }
}

void AppendCount(std::string& out, uint64_t n) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), n);
  out.append(buf, r.ptr);
}

void AppendEscapedHelp(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

void AppendEscapedLabelValue(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

// Appends `{a="x",b="y"}` (nothing when there are no labels and no `le`).
void AppendLabels(std::string& out, const Labels& labels, const std::string* le) {
  if (labels.empty() && le == nullptr) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    AppendEscapedLabelValue(out, v);
    out += '"';
  }
  if (le != nullptr) {
    if (!first) out += ',';
    out += "le=\"";
    out += *le;
    out += '"';
  }
  out += '}';
}

}  // namespace

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Series* Registry::FindOrCreate(std::string_view name, std::string_view help, Type type,
                                         const std::vector<double>* buckets, const Labels& labels) {
  auto make_series = [&](Labels normalized) {
    auto s = std::make_unique<Series>();
    s->labels = std::move(normalized);
    switch (type) {
      case Type::kCounter:
        s->metric = std::make_unique<Counter>();
        break;
      case Type::kGauge:
        s->metric = std::make_unique<Gauge>();
        break;
      case Type::kHistogram:
        s->metric = std::make_unique<Histogram>(*buckets);
        break;
    }
    return s;
  };

  // Normalize outside the lock: sort by label name, sanitize values.
  Labels normalized;
  normalized.reserve(labels.size());
  for (const auto& [k, v] : labels) normalized.emplace_back(k, SanitizeUtf8(v));
  std::sort(normalized.begin(), normalized.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });

  std::string error;
  if (!IsValidMetricName(name)) {
    error = "invalid metric name";
  }
  for (size_t i = 0; error.empty() && i < normalized.size(); ++i) {
    const std::string& k = normalized[i].first;
    if (!IsValidLabelName(k)) {
      error = "invalid label name \"" + k + "\"";
    } else if (i > 0 && normalized[i - 1].first == k) {
      error = "duplicate label name \"" + k + "\"";
    } else if (type == Type::kHistogram && k == "le") {
      error = "label name \"le\" is reserved for histogram buckets";
    }
  }
  const std::vector<double> bounds =
      type == Type::kHistogram ? NormalizeBuckets(*buckets) : std::vector<double>{};

  std::lock_guard<std::mutex> lock(mu_);
  Family* family = nullptr;
  if (error.empty()) {
    auto it = families_.find(name);
    if (it == families_.end()) {
      auto f = std::make_unique<Family>();
      f->help = SanitizeUtf8(help);
      f->type = type;
      f->bounds = bounds;
      family = f.get();
      families_.emplace(std::string(name), std::move(f));
    } else {
      family = it->second.get();
      if (family->type != type) {
        error = std::string("already registered as a ") + TypeName(static_cast<int>(family->type)) +
                ", asked for a " + TypeName(static_cast<int>(type));
      } else if (family->bounds != bounds) {
        error = "already registered with other histogram buckets";
      }
    }
  }
  if (!error.empty()) {
    LOOM_LOG(ERROR) << "metrics: programming error for metric \"" << name << "\": " << error
                    << "; returning a detached metric that is never exported";
    dummies_.push_back(make_series(std::move(normalized)));
    return dummies_.back().get();
  }
  auto sit = family->series.find(normalized);
  if (sit == family->series.end()) {
    auto s = make_series(normalized);
    sit = family->series.emplace(std::move(normalized), std::move(s)).first;
  }
  sit->second->exported = true;
  return sit->second.get();
}

Counter& Registry::GetCounter(std::string_view name, std::string_view help, const Labels& labels) {
  return *std::get<std::unique_ptr<Counter>>(
      FindOrCreate(name, help, Type::kCounter, nullptr, labels)->metric);
}

Gauge& Registry::GetGauge(std::string_view name, std::string_view help, const Labels& labels) {
  return *std::get<std::unique_ptr<Gauge>>(
      FindOrCreate(name, help, Type::kGauge, nullptr, labels)->metric);
}

Histogram& Registry::GetHistogram(std::string_view name, std::string_view help,
                                  const std::vector<double>& buckets, const Labels& labels) {
  return *std::get<std::unique_ptr<Histogram>>(
      FindOrCreate(name, help, Type::kHistogram, &buckets, labels)->metric);
}

void Registry::RemoveSeries(std::string_view name, const Labels& labels) {
  Labels normalized;
  for (const auto& [k, v] : labels) normalized.emplace_back(k, SanitizeUtf8(v));
  std::sort(normalized.begin(), normalized.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return;
  auto sit = it->second->series.find(normalized);
  if (sit != it->second->series.end()) sit->second->exported = false;
}

void Registry::AddCollectHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hooks_mu_);
  hooks_.push_back(std::move(hook));
}

std::string Registry::Serialize() {
  {
    std::lock_guard<std::mutex> lock(hooks_mu_);
    for (const auto& hook : hooks_) hook();
  }

  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, family] : families_) {
    const bool any = std::any_of(family->series.begin(), family->series.end(),
                                 [](const auto& s) { return s.second->exported; });
    if (!any) continue;
    out += "# HELP ";
    out += name;
    out += ' ';
    AppendEscapedHelp(out, family->help);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += TypeName(static_cast<int>(family->type));
    out += '\n';
    for (const auto& [labels, series] : family->series) {
      if (!series->exported) continue;
      if (family->type == Type::kHistogram) {
        const Histogram& h = *std::get<std::unique_ptr<Histogram>>(series->metric);
        const std::vector<uint64_t> cumulative = h.CumulativeCounts();
        std::string le;
        for (size_t i = 0; i < cumulative.size(); ++i) {
          le.clear();
          if (i < h.bounds().size()) {
            AppendValue(le, h.bounds()[i]);
          } else {
            le = "+Inf";
          }
          out += name;
          out += "_bucket";
          AppendLabels(out, labels, &le);
          out += ' ';
          AppendCount(out, cumulative[i]);
          out += '\n';
        }
        out += name;
        out += "_sum";
        AppendLabels(out, labels, nullptr);
        out += ' ';
        AppendValue(out, h.Sum());
        out += '\n';
        out += name;
        out += "_count";
        AppendLabels(out, labels, nullptr);
        out += ' ';
        AppendCount(out, cumulative.back());
        out += '\n';
        continue;
      }
      const double v = family->type == Type::kCounter
                           ? std::get<std::unique_ptr<Counter>>(series->metric)->Value()
                           : std::get<std::unique_ptr<Gauge>>(series->metric)->Value();
      out += name;
      AppendLabels(out, labels, nullptr);
      out += ' ';
      AppendValue(out, v);
      out += '\n';
    }
  }
  return out;
}

}  // namespace loom::metrics
