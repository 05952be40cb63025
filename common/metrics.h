// Loom's Prometheus metrics: a thin layer over prometheus-cpp (Debian 12's prometheus-cpp-dev).
//
//   metrics::Registry registry;
//   metrics::Counter& launches = registry.GetCounter(
//       "loom_worker_launches_total", "Rank processes launched.", {{"node", "n1"}});
//   launches.Increment();
//   std::string text = registry.Serialize();  // text exposition format 0.0.4
//
// The metric objects are prometheus-cpp's own (Counter, Gauge, Histogram); this layer adds what
// Loom's call sites need on top of prometheus::Registry and prometheus::Family:
//   - lookup by (name, labels) in one call, the family built on first use;
//   - RemoveSeries, so that series of finished jobs and ranks do not accumulate;
//   - collect hooks that refresh gauges from live state before every scrape (Collectable());
//   - no exceptions: prometheus-cpp throws std::invalid_argument on a bad metric or label name,
//     a name reused with another type or unsorted histogram buckets; the control plane has no
//     exceptions, so every name, label set and bucket layout is validated here before it reaches
//     prometheus-cpp, and nothing here throws;
//   - input hygiene: label values often come from input (job and node names), and Prometheus
//     rejects a whole scrape with invalid UTF-8 in it, so invalid bytes become U+FFFD.
//
// Threading: every method here is thread-safe; metric updates (Increment, Set, Observe) are
// prometheus-cpp's lock-free atomics. Get*() takes the registry lock and looks the series up, so
// callers should look a series up once and keep the reference (unless they remove it: see
// RemoveSeries).
//
// Errors: metric names and label names are fixed by the program, never by input, so a bad name, a
// name reused with another type (or other histogram buckets), or a duplicate label name is a
// programming error. It is logged and a detached dummy metric is returned (updates are accepted
// and never exported): a typo in a metric name must not take a daemon down.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace loom::metrics {

// Label (name, value) pairs. Order does not matter: {a,b} and {b,a} name the same series.
using Labels = std::vector<std::pair<std::string, std::string>>;

// prometheus-cpp's types. Counter::Increment ignores a negative amount; Name counters `..._total`.
// A histogram is exported as cumulative `_bucket{le=...}` series plus `_sum` and `_count`.
using Counter = prometheus::Counter;
using Gauge = prometheus::Gauge;
using Histogram = prometheus::Histogram;

// Common bucket layouts.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The same (name, labels) returns the same object. `help` is taken from the first registration
  // of `name`. A name must match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*
  // (not starting with "__", and not "le" on a histogram); label values are any text (invalid
  // UTF-8 replaced, escaped on output). A reference stays valid for the registry's lifetime
  // unless its series is removed (RemoveSeries).
  Counter& GetCounter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& GetGauge(std::string_view name, std::string_view help, const Labels& labels = {});
  // `buckets` are upper bounds; they are sorted, de-duplicated, and NaN/+Inf are dropped (the
  // +Inf bucket is always implied). All series of one histogram name share one bucket layout; a
  // different layout for an existing name is a programming error (dummy returned).
  Histogram& GetHistogram(std::string_view name, std::string_view help,
                          const std::vector<double>& buckets, const Labels& labels = {});

  // Stops exporting one series (e.g. the gauges of a job that has finished) so that label sets do
  // not accumulate forever. The series is destroyed (prometheus::Family::Remove): a reference to
  // it obtained earlier must not be used afterwards, so a caller that removes series must not
  // keep references to them, and must not race its own Get*() of a series with its removal. A
  // later Get*() of the same series exports a new one that starts from zero. A family whose
  // every series is removed is not exported at all. Unknown series are ignored.
  void RemoveSeries(std::string_view name, const Labels& labels);

  // Hooks run at the start of every scrape (Serialize(), or Collectable()->Collect() from the
  // metrics endpoint), in the order added, outside the registry lock (so they may call Get*() and
  // RemoveSeries() and update metrics) to refresh gauges from live state. Hooks of concurrent
  // scrapes never run at the same time as each other. A hook must not scrape or add hooks.
  void AddCollectHook(std::function<void()> hook);

  // What the metrics endpoint serves (prometheus::Exposer::RegisterCollectable): collecting it
  // runs the hooks, then collects the series. It refers to this registry, which must outlive
  // every scrape of it.
  std::shared_ptr<prometheus::Collectable> Collectable() const;

  // The text exposition format 0.0.4 of a scrape (prometheus::TextSerializer), for tests and
  // tools: per metric name one # HELP and one # TYPE line, then its series.
  std::string Serialize();

 private:
  class HookedCollectable;
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family;

  // Runs the hooks (serialized by hooks_mu_).
  void RunHooks();
  // Returns the family of `name` for `type` (creating it), or null after logging a programming
  // error. `buckets` is the normalized layout for histograms, empty otherwise.
  Family* FindOrCreateFamily(std::string_view name, std::string_view help, Type type,
                             const std::vector<double>& buckets) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<prometheus::Registry> registry_;
  const std::shared_ptr<HookedCollectable> collectable_;

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_ ABSL_GUARDED_BY(mu_);
  // Detached metrics handed out on programming errors; kept so references stay valid.
  std::vector<std::unique_ptr<Counter>> dummy_counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Gauge>> dummy_gauges_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Histogram>> dummy_histograms_ ABSL_GUARDED_BY(mu_);

  // Guards hooks_ and is held while they run, so one scrape runs hooks at a time.
  absl::Mutex hooks_mu_;
  std::vector<std::function<void()>> hooks_ ABSL_GUARDED_BY(hooks_mu_);
};

}  // namespace loom::metrics
