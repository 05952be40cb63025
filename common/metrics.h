// A small, thread-safe Prometheus metrics registry (prometheus-cpp is not packaged in Debian 12).
//
//   metrics::Registry registry;
//   metrics::Counter& launches = registry.GetCounter(
//       "loom_worker_launches_total", "Rank processes launched.", {{"node", "n1"}});
//   launches.Increment();
//   std::string text = registry.Serialize();  // text exposition format 0.0.4
//
// Threading: every method of every class here is thread-safe. Metric updates (Increment, Set,
// Observe) are lock-free atomics, so hot paths may call them freely; Get*() takes the registry
// lock and looks the series up, so callers should look a series up once and keep the reference.
//
// Errors: metric names and label names are fixed by the program, never by input, so a bad name, a
// name reused with another type (or other histogram buckets), or a duplicate label name is a
// programming error. It is logged and a detached dummy metric is returned (updates are accepted
// and never exported): a typo in a metric name must not take a daemon down.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::metrics {

// Label (name, value) pairs. Order does not matter: {a,b} and {b,a} name the same series.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A value that only goes up (Prometheus type "counter"). Name it `..._total`.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `by`. A negative or NaN `by` is ignored: a counter never goes down.
  void Increment(double by = 1.0);
  double Value() const;

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (Prometheus type "gauge").
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v);
  void Increment(double by = 1.0);
  void Decrement(double by = 1.0);
  double Value() const;

 private:
  std::atomic<double> value_{0.0};
};

// A distribution over fixed buckets (Prometheus type "histogram"); exported as cumulative
// `_bucket{le=...}` series, plus `_sum` and `_count`.
class Histogram {
 public:
  // `buckets` are upper bounds; they are sorted, de-duplicated, and NaN/+Inf are dropped (the
  // +Inf bucket is always implied).
  explicit Histogram(std::vector<double> buckets);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `v` in the first bucket whose bound is >= v. NaN is ignored.
  void Observe(double v);

  // Snapshot accessors (for tests and exposition). A snapshot taken while other threads observe
  // may be mid-update, but Count() always equals the sum of the bucket counts it is built from.
  const std::vector<double>& bounds() const { return bounds_; }
  std::vector<uint64_t> CumulativeCounts() const;  // bounds().size() + 1 entries; last is +Inf
  uint64_t Count() const;
  double Sum() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative; +Inf last
  std::atomic<double> sum_{0.0};
};

// Common bucket layouts.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The same (name, labels) returns the same object; references stay valid for the registry's
  // lifetime. `help` is taken from the first registration of `name`. A name must match
  // [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* (not starting with "__", and not
  // "le" on a histogram); label values are any UTF-8 text (escaped on output).
  Counter& GetCounter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& GetGauge(std::string_view name, std::string_view help, const Labels& labels = {});
  // All series of one histogram name share one bucket layout; a different layout for an existing
  // name is a programming error (dummy returned).
  Histogram& GetHistogram(std::string_view name, std::string_view help,
                          const std::vector<double>& buckets, const Labels& labels = {});

  // Stops exporting one series (e.g. the gauges of a job that has been deleted) so that label
  // sets do not accumulate forever. The object stays alive, so references held elsewhere stay
  // valid; a later Get*() of the same series exports it again (with its old value). Unknown
  // series are ignored.
  void RemoveSeries(std::string_view name, const Labels& labels);

  // Hooks run at the start of every Serialize(), in the order added, outside the registry lock
  // (so they may call Get*() and update metrics) to refresh gauges from live state. Hooks of
  // concurrent Serialize() calls never run at the same time as each other. A hook must not call
  // Serialize() or AddCollectHook().
  void AddCollectHook(std::function<void()> hook);

  // The text exposition format 0.0.4: per metric name (sorted by name) one # HELP and one # TYPE
  // line, then its series sorted by their labels (name, then value); label values and help text
  // escaped.
  std::string Serialize();

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series;
  struct Family;

  // Returns the series for (name, labels), creating it; on a programming error (logged), a
  // detached dummy series kept in dummies_.
  Series* FindOrCreate(std::string_view name, std::string_view help, Type type,
                       const std::vector<double>* buckets, const Labels& labels);

  std::mutex mu_;  // guards families_ and dummies_
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;
  // Detached metrics handed out on programming errors; kept so references stay valid.
  std::vector<std::unique_ptr<Series>> dummies_;

  // Guards hooks_ and is held while they run, so one Serialize() runs hooks at a time.
  std::mutex hooks_mu_;
  std::vector<std::function<void()>> hooks_;
};

}  // namespace loom::metrics
