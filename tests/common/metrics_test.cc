#include "common/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RegistryTest, SerializesSmallRegistryExactly) {
  Registry r;
  r.GetCounter("loom_launches_total", "Rank processes launched.", {{"node", "n2"}}).Increment(3);
  r.GetCounter("loom_launches_total", "ignored: help comes from the first registration",
               {{"node", "n1"}})
      .Increment();
  r.GetGauge("loom_queue_depth", "Jobs waiting.").Set(7);
  Histogram& h = r.GetHistogram("loom_latency_seconds", "Scheduling latency.", {0.1, 1});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(2);
  // Families sorted by name ("latency" < "launches"), series by labels.
  EXPECT_EQ(r.Serialize(),
            "# HELP loom_latency_seconds Scheduling latency.\n"
            "# TYPE loom_latency_seconds histogram\n"
            "loom_latency_seconds_bucket{le=\"0.1\"} 1\n"
            "loom_latency_seconds_bucket{le=\"1\"} 2\n"
            "loom_latency_seconds_bucket{le=\"+Inf\"} 3\n"
            "loom_latency_seconds_sum 2.55\n"
            "loom_latency_seconds_count 3\n"
            "# HELP loom_launches_total Rank processes launched.\n"
            "# TYPE loom_launches_total counter\n"
            "loom_launches_total{node=\"n1\"} 1\n"
            "loom_launches_total{node=\"n2\"} 3\n"
            "# HELP loom_queue_depth Jobs waiting.\n"
            "# TYPE loom_queue_depth gauge\n"
            "loom_queue_depth 7\n");
}

TEST(RegistryTest, EmptyRegistrySerializesToNothing) {
  Registry r;
  EXPECT_EQ(r.Serialize(), "");
}

TEST(RegistryTest, SameNameAndLabelsReturnSameObjectWhateverTheLabelOrder) {
  Registry r;
  Counter& a = r.GetCounter("c_total", "h", {{"a", "1"}, {"b", "2"}});
  Counter& b = r.GetCounter("c_total", "h", {{"b", "2"}, {"a", "1"}});
  Counter& other = r.GetCounter("c_total", "h", {{"a", "1"}, {"b", "3"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &other);
  // Labels are printed sorted by name.
  a.Increment();
  EXPECT_THAT(r.Serialize(), HasSubstr("c_total{a=\"1\",b=\"2\"} 1\n"));
}

TEST(RegistryTest, ReferencesStayValidAsTheRegistryGrows) {
  Registry r;
  Gauge& first = r.GetGauge("g", "h", {{"i", "0"}});
  for (int i = 1; i < 1000; ++i) r.GetGauge("g", "h", {{"i", std::to_string(i)}});
  first.Set(42);
  EXPECT_EQ(r.GetGauge("g", "h", {{"i", "0"}}).Value(), 42);
  EXPECT_THAT(r.Serialize(), HasSubstr("g{i=\"0\"} 42\n"));
}

TEST(RegistryTest, EscapesLabelValuesAndHelp) {
  Registry r;
  r.GetGauge("g", "line one\nback\\slash \"quoted\"", {{"v", "a\"b\\c\nd"}}).Set(1);
  EXPECT_EQ(r.Serialize(),
            "# HELP g line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE g gauge\n"
            "g{v=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(RegistryTest, ReplacesInvalidUtf8InLabelValues) {
  Registry r;
  r.GetGauge("g", "h", {{"v", std::string("ok\xff\xc3\xa9", 5)}}).Set(1);
  // 0xff is invalid and becomes U+FFFD; "é" (c3 a9) is kept.
  EXPECT_THAT(r.Serialize(), HasSubstr("g{v=\"ok\xEF\xBF\xBD\xC3\xA9\"} 1\n"));
}

TEST(RegistryTest, FormatsSpecialAndLargeValues) {
  Registry r;
  r.GetGauge("g", "h", {{"k", "a"}}).Set(std::numeric_limits<double>::infinity());
  r.GetGauge("g", "h", {{"k", "b"}}).Set(-std::numeric_limits<double>::infinity());
  r.GetGauge("g", "h", {{"k", "c"}}).Set(std::nan(""));
  r.GetGauge("g", "h", {{"k", "d"}}).Set(0.1);
  r.GetGauge("g", "h", {{"k", "e"}}).Set(-2.5e-9);
  r.GetGauge("g", "h", {{"k", "f"}}).Set(123456789012);
  const std::string text = r.Serialize();
  EXPECT_THAT(text, HasSubstr("g{k=\"a\"} +Inf\n"));
  EXPECT_THAT(text, HasSubstr("g{k=\"b\"} -Inf\n"));
  EXPECT_THAT(text, HasSubstr("g{k=\"c\"} NaN\n"));
  EXPECT_THAT(text, HasSubstr("g{k=\"d\"} 0.1\n"));
  EXPECT_THAT(text, HasSubstr("g{k=\"e\"} -2.5e-09\n"));
  EXPECT_THAT(text, HasSubstr("g{k=\"f\"} 123456789012\n"));
}

TEST(CounterTest, NeverGoesDown) {
  Counter c;
  c.Increment(2);
  c.Increment(-1);
  c.Increment(std::nan(""));
  c.Increment();
  EXPECT_EQ(c.Value(), 3);
}

TEST(GaugeTest, SetIncrementDecrement) {
  Gauge g;
  g.Set(10);
  g.Increment(2.5);
  g.Decrement();
  g.Decrement(20);
  EXPECT_EQ(g.Value(), -8.5);
}

TEST(HistogramTest, BucketsAreInclusiveUpperBoundsAndCumulative) {
  Histogram h({1, 2, 4});
  for (double v : {0.0, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, -1.0}) h.Observe(v);
  h.Observe(std::nan(""));  // ignored
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{3, 5, 7, 8}));
  EXPECT_EQ(h.Count(), 8u);
  EXPECT_DOUBLE_EQ(h.Sum(), 15.5);
}

TEST(HistogramTest, SortsAndDeduplicatesBuckets) {
  Histogram h({4, 1, 2, 2, std::numeric_limits<double>::infinity(), std::nan("")});
  EXPECT_EQ(h.bounds(), (std::vector<double>{1, 2, 4}));
  h.Observe(1e9);
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{0, 0, 0, 1}));
}

TEST(HistogramTest, SerializesLabelsBeforeLe) {
  Registry r;
  r.GetHistogram("h_seconds", "h", {0.5}, {{"method", "Get"}}).Observe(0.25);
  EXPECT_EQ(r.Serialize(),
            "# HELP h_seconds h\n"
            "# TYPE h_seconds histogram\n"
            "h_seconds_bucket{method=\"Get\",le=\"0.5\"} 1\n"
            "h_seconds_bucket{method=\"Get\",le=\"+Inf\"} 1\n"
            "h_seconds_sum{method=\"Get\"} 0.25\n"
            "h_seconds_count{method=\"Get\"} 1\n");
}

TEST(BucketsTest, ExponentialAndLinear) {
  EXPECT_EQ(ExponentialBuckets(0.001, 10, 4), (std::vector<double>{0.001, 0.01, 0.1, 1}));
  EXPECT_EQ(LinearBuckets(1, 2, 3), (std::vector<double>{1, 3, 5}));
}

TEST(RegistryTest, ProgrammingErrorsReturnDetachedMetrics) {
  Registry r;
  r.GetCounter("used_total", "h").Increment(5);
  // A type clash: the gauge works but is never exported; the counter is untouched.
  Gauge& clash = r.GetGauge("used_total", "h");
  clash.Set(99);
  EXPECT_EQ(clash.Value(), 99);
  // Bad metric names, bad label names, duplicate labels, "le" on a histogram, other buckets.
  r.GetCounter("1starts_with_digit", "h").Increment();
  r.GetCounter("has-dash", "h").Increment();
  r.GetCounter("", "h").Increment();
  r.GetGauge("ok_gauge", "h", {{"bad-label", "x"}}).Set(1);
  r.GetGauge("ok_gauge", "h", {{"__reserved", "x"}}).Set(1);
  r.GetGauge("ok_gauge", "h", {{"a", "x"}, {"a", "y"}}).Set(1);
  r.GetHistogram("hist", "h", {1}, {{"le", "x"}}).Observe(1);
  r.GetHistogram("hist2", "h", {1}).Observe(1);
  r.GetHistogram("hist2", "h", {1, 2}).Observe(1);  // other buckets: detached
  Histogram& same = r.GetHistogram("hist2", "h", {1});
  EXPECT_EQ(same.Count(), 1u);
  EXPECT_EQ(r.Serialize(),
            "# HELP hist2 h\n"
            "# TYPE hist2 histogram\n"
            "hist2_bucket{le=\"1\"} 1\n"
            "hist2_bucket{le=\"+Inf\"} 1\n"
            "hist2_sum 1\n"
            "hist2_count 1\n"
            "# HELP used_total h\n"
            "# TYPE used_total counter\n"
            "used_total 5\n");
}

TEST(RegistryTest, RemoveSeriesHidesItUntilFetchedAgain) {
  Registry r;
  Gauge& g = r.GetGauge("job_step", "h", {{"job", "jobs/a"}});
  g.Set(3);
  r.GetGauge("job_step", "h", {{"job", "jobs/b"}}).Set(4);
  r.RemoveSeries("job_step", {{"job", "jobs/a"}});
  r.RemoveSeries("job_step", {{"job", "jobs/unknown"}});  // ignored
  r.RemoveSeries("no_such_metric", {});                   // ignored
  EXPECT_THAT(r.Serialize(), Not(HasSubstr("jobs/a")));
  g.Set(5);  // the reference is still valid
  EXPECT_EQ(&r.GetGauge("job_step", "h", {{"job", "jobs/a"}}), &g);
  EXPECT_THAT(r.Serialize(), HasSubstr("job_step{job=\"jobs/a\"} 5\n"));
  // A family whose every series is removed disappears, HELP and TYPE included.
  r.RemoveSeries("job_step", {{"job", "jobs/a"}});
  r.RemoveSeries("job_step", {{"job", "jobs/b"}});
  EXPECT_EQ(r.Serialize(), "");
}

TEST(RegistryTest, CollectHooksRunBeforeEverySerializeInOrder) {
  Registry r;
  int calls = 0;
  std::vector<int> order;
  r.AddCollectHook([&] {
    ++calls;
    order.push_back(1);
    // Hooks run outside the registry lock, so they may create and set metrics.
    r.GetGauge("live_value", "Refreshed by a hook.").Set(calls * 10);
  });
  r.AddCollectHook([&] { order.push_back(2); });
  EXPECT_THAT(r.Serialize(), HasSubstr("live_value 10\n"));
  EXPECT_THAT(r.Serialize(), HasSubstr("live_value 20\n"));
  EXPECT_EQ(order, (std::vector<int>{1, 2, 1, 2}));
}

TEST(RegistryTest, ConcurrentUpdatesAreExact) {
  Registry r;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&r, t] {
      // Every thread looks the series up itself, racing on creation as well.
      Counter& c = r.GetCounter("ops_total", "h", {{"kind", "shared"}});
      Gauge& g = r.GetGauge("level", "h");
      Histogram& h = r.GetHistogram("size_bytes", "h", {10, 100});
      Counter& mine = r.GetCounter("ops_total", "h", {{"kind", "t" + std::to_string(t)}});
      for (int i = 0; i < kPerThread; ++i) {
        c.Increment();
        mine.Increment(0.5);
        g.Increment(2);
        g.Decrement();
        h.Observe(i % 200);
      }
    });
  }
  // Scrapes running at the same time must not disturb anything.
  std::thread scraper([&r] {
    for (int i = 0; i < 50; ++i) r.Serialize();
  });
  for (auto& t : threads) t.join();
  scraper.join();
  EXPECT_EQ(r.GetCounter("ops_total", "h", {{"kind", "shared"}}).Value(), kThreads * kPerThread);
  EXPECT_EQ(r.GetGauge("level", "h").Value(), kThreads * kPerThread);
  const Histogram& h = r.GetHistogram("size_bytes", "h", {10, 100});
  EXPECT_EQ(h.Count(), static_cast<uint64_t>(kThreads) * kPerThread);
  // Per thread, i % 200 in 0..10 is 11 of every 200 values, 0..100 is 101 of every 200.
  const uint64_t per = kPerThread / 200;
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{kThreads * per * 11, kThreads * per * 101,
                                                         uint64_t{kThreads} * kPerThread}));
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(r.GetCounter("ops_total", "h", {{"kind", "t" + std::to_string(t)}}).Value(),
              kPerThread * 0.5);
  }
}

// The real Prometheus tool agrees that the exposition parses and passes its lint rules.
TEST(RegistryTest, PromtoolAcceptsTheExposition) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool is not on PATH; install the Debian package prometheus to run this";
  }
  Registry r;
  r.GetCounter("loom_launches_total", "Rank processes launched.", {{"node", "n\"1\\\n"}})
      .Increment();
  r.GetGauge("loom_queue_depth", "Jobs waiting.\nSecond line.").Set(-3.5);
  r.GetGauge("loom_nodes", "Nodes by state.", {{"state", "ready"}}).Set(2);
  r.GetGauge("loom_nodes", "Nodes by state.", {{"state", "lost"}})
      .Set(std::numeric_limits<double>::infinity());
  r.GetHistogram("loom_scheduling_latency_seconds", "Latency.", ExponentialBuckets(1e-4, 10, 5),
                 {{"kind", "gpu"}})
      .Observe(0.003);
  r.GetGauge("loom_utf8_info", "Odd bytes.", {{"v", std::string("\xff\xfe", 2)}}).Set(1);
  const std::string path = testing::TempDir() + "/promtool_input.prom";
  {
    std::ofstream out(path);
    out << r.Serialize();
  }
  const std::string cmd = "promtool check metrics < '" + path + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << "promtool said:\n" << output << "\non:\n" << r.Serialize();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace loom::metrics
