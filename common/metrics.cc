#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/logging.h"
#include "prometheus/check_names.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace loom::metrics {

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

namespace {

using LabelMap = std::map<std::string, std::string>;  // prometheus::Labels

// prometheus::Histogram's constructor throws unless its bounds are strictly increasing.
std::vector<double> NormalizeBuckets(std::vector<double> buckets) {
  std::erase_if(buckets, [](double b) { return std::isnan(b) || b == HUGE_VAL; });
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  return buckets;
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

// prometheus-cpp 1.0.1's TextSerializer escapes label values but writes HELP text verbatim, so a
// backslash or a newline in it would break the exposition: escape them as the format requires.
std::string EscapeHelp(std::string_view help) {
  std::string out;
  for (char c : SanitizeUtf8(help)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Checks `labels` and converts them into prometheus-cpp's form, values sanitized. Returns an
// error message for a programming error (prometheus-cpp would throw, or export a broken series).
std::string ToLabelMap(const Labels& labels, bool histogram, LabelMap& out) {
  for (const auto& [k, v] : labels) {
    if (!prometheus::CheckLabelName(k)) return "invalid label name \"" + k + "\"";
    if (histogram && k == "le") return "label name \"le\" is reserved for histogram buckets";
    if (!out.emplace(k, SanitizeUtf8(v)).second) return "duplicate label name \"" + k + "\"";
  }
  return "";
}

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

void LogProgrammingError(std::string_view name, std::string_view error) {
  LOOM_LOG(ERROR) << "metrics: programming error for metric \"" << name << "\": " << error
                  << "; returning a detached metric that is never exported";
}

}  // namespace

// The collectable the metrics endpoint scrapes: the hooks, then the series.
class Registry::HookedCollectable : public prometheus::Collectable {
 public:
  explicit HookedCollectable(Registry* owner) : owner_(owner) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    owner_->RunHooks();
    return owner_->registry_->Collect();
  }

 private:
  Registry* const owner_;
};

struct Registry::Family {
  Type type;
  std::vector<double> buckets;  // histograms only, normalized
  // Owned by registry_; exactly the one of `type` is set.
  prometheus::Family<Counter>* counters = nullptr;
  prometheus::Family<Gauge>* gauges = nullptr;
  prometheus::Family<Histogram>* histograms = nullptr;
};

Registry::Registry()
    : registry_(std::make_shared<prometheus::Registry>()),
      collectable_(std::make_shared<HookedCollectable>(this)) {}

Registry::~Registry() = default;

std::shared_ptr<prometheus::Collectable> Registry::Collectable() const { return collectable_; }

Registry::Family* Registry::FindOrCreateFamily(std::string_view name, std::string_view help,
                                               Type type, const std::vector<double>& buckets) {
  auto it = families_.find(name);
  if (it != families_.end()) {
    Family* family = it->second.get();
    if (family->type != type) {
      LogProgrammingError(name, std::string("already registered as a ") +
                                    TypeName(static_cast<int>(family->type)) + ", asked for a " +
                                    TypeName(static_cast<int>(type)));
      return nullptr;
    }
    if (family->buckets != buckets) {
      LogProgrammingError(name, "already registered with other histogram buckets");
      return nullptr;
    }
    return family;
  }
  const std::string name_str(name);
  if (!prometheus::CheckMetricName(name_str)) {
    LogProgrammingError(name, "invalid metric name");
    return nullptr;
  }
  auto family = std::make_unique<Family>();
  family->type = type;
  family->buckets = buckets;
  const std::string escaped_help = EscapeHelp(help);
  // Cannot throw: the name is valid and new to registry_, whatever its type.
  switch (type) {
    case Type::kCounter:
      family->counters =
          &prometheus::BuildCounter().Name(name_str).Help(escaped_help).Register(*registry_);
      break;
    case Type::kGauge:
      family->gauges =
          &prometheus::BuildGauge().Name(name_str).Help(escaped_help).Register(*registry_);
      break;
    case Type::kHistogram:
      family->histograms =
          &prometheus::BuildHistogram().Name(name_str).Help(escaped_help).Register(*registry_);
      break;
  }
  return families_.emplace(name_str, std::move(family)).first->second.get();
}

Counter& Registry::GetCounter(std::string_view name, std::string_view help, const Labels& labels) {
  LabelMap map;
  const std::string error = ToLabelMap(labels, false, map);
  absl::MutexLock lock(&mu_);
  Family* family = nullptr;
  if (!error.empty()) {
    LogProgrammingError(name, error);
  } else {
    family = FindOrCreateFamily(name, help, Type::kCounter, {});
  }
  if (family == nullptr) return *dummy_counters_.emplace_back(std::make_unique<Counter>());
  return family->counters->Add(map);
}

Gauge& Registry::GetGauge(std::string_view name, std::string_view help, const Labels& labels) {
  LabelMap map;
  const std::string error = ToLabelMap(labels, false, map);
  absl::MutexLock lock(&mu_);
  Family* family = nullptr;
  if (!error.empty()) {
    LogProgrammingError(name, error);
  } else {
    family = FindOrCreateFamily(name, help, Type::kGauge, {});
  }
  if (family == nullptr) return *dummy_gauges_.emplace_back(std::make_unique<Gauge>());
  return family->gauges->Add(map);
}

Histogram& Registry::GetHistogram(std::string_view name, std::string_view help,
                                  const std::vector<double>& buckets, const Labels& labels) {
  const std::vector<double> bounds = NormalizeBuckets(buckets);
  LabelMap map;
  const std::string error = ToLabelMap(labels, true, map);
  absl::MutexLock lock(&mu_);
  Family* family = nullptr;
  if (!error.empty()) {
    LogProgrammingError(name, error);
  } else {
    family = FindOrCreateFamily(name, help, Type::kHistogram, bounds);
  }
  if (family == nullptr) {
    return *dummy_histograms_.emplace_back(std::make_unique<Histogram>(bounds));
  }
  return family->histograms->Add(map, bounds);
}

void Registry::RemoveSeries(std::string_view name, const Labels& labels) {
  LabelMap map;
  if (!ToLabelMap(labels, false, map).empty()) return;  // never exported
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return;
  Family& family = *it->second;
  // prometheus::Family removes by object: Add() returns the existing one (Has() checked first,
  // so that removing an unknown series does not create it).
  switch (family.type) {
    case Type::kCounter:
      if (family.counters->Has(map)) family.counters->Remove(&family.counters->Add(map));
      break;
    case Type::kGauge:
      if (family.gauges->Has(map)) family.gauges->Remove(&family.gauges->Add(map));
      break;
    case Type::kHistogram:
      if (family.histograms->Has(map)) {
        family.histograms->Remove(&family.histograms->Add(map, family.buckets));
      }
      break;
  }
}

void Registry::AddCollectHook(std::function<void()> hook) {
  absl::MutexLock lock(&hooks_mu_);
  hooks_.push_back(std::move(hook));
}

void Registry::RunHooks() {
  absl::MutexLock lock(&hooks_mu_);
  for (const auto& hook : hooks_) hook();
}

std::string Registry::Serialize() {
  return prometheus::TextSerializer().Serialize(collectable_->Collect());
}

}  // namespace loom::metrics
