// The metrics registry over prometheus-cpp: lookup, removal, hooks, programming errors that must
// not throw, the exposition it yields and promtool's verdict on it.
#include "common/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"

namespace loom::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The exposition's lines as a set: prometheus-cpp orders families by type and series by hash.
std::multiset<std::string> Lines(const std::string& text) {
  std::multiset<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.insert(line);
  return out;
}

TEST(RegistryTest, ExportsNamesLabelsHelpAndTypes) {
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
  const std::string text = r.Serialize();
  EXPECT_EQ(Lines(text), (std::multiset<std::string>{
                             "# HELP loom_latency_seconds Scheduling latency.",
                             "# TYPE loom_latency_seconds histogram",
                             "loom_latency_seconds_bucket{le=\"0.1\"} 1",
                             "loom_latency_seconds_bucket{le=\"1\"} 2",
                             "loom_latency_seconds_bucket{le=\"+Inf\"} 3",
                             "loom_latency_seconds_sum 2.55",
                             "loom_latency_seconds_count 3",
                             "# HELP loom_launches_total Rank processes launched.",
                             "# TYPE loom_launches_total counter",
                             "loom_launches_total{node=\"n1\"} 1",
                             "loom_launches_total{node=\"n2\"} 3",
                             "# HELP loom_queue_depth Jobs waiting.",
                             "# TYPE loom_queue_depth gauge",
                             "loom_queue_depth 7",
                         }));
  // One HELP and TYPE per family, right before its series.
  EXPECT_THAT(text, HasSubstr("# HELP loom_queue_depth Jobs waiting.\n"
                              "# TYPE loom_queue_depth gauge\n"
                              "loom_queue_depth 7\n"));
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
  Histogram& h1 = r.GetHistogram("h_seconds", "h", {1, 2}, {{"k", "v"}});
  EXPECT_EQ(&h1, &r.GetHistogram("h_seconds", "h", {2, 1}, {{"k", "v"}}));
  // Labels are printed sorted by name.
  a.Increment();
  EXPECT_THAT(r.Serialize(), HasSubstr("c_total{a=\"1\",b=\"2\"} 1\n"));
}

TEST(RegistryTest, ReferencesStayValidAsTheRegistryGrows) {
  Registry r;
  Gauge& first = r.GetGauge("g", "h", {{"i", "0"}});
  for (int i = 1; i < 1000; ++i) r.GetGauge("g", "h", {{"i", std::to_string(i)}});
  for (int i = 0; i < 100; ++i) r.GetCounter("c" + std::to_string(i) + "_total", "h");
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
  // 0xff is invalid and becomes U+FFFD; "é" (c3 a9) is kept. The same input names the same series.
  EXPECT_EQ(&r.GetGauge("g", "h", {{"v", std::string("ok\xff\xc3\xa9", 5)}}),
            &r.GetGauge("g", "h", {{"v", "ok\xEF\xBF\xBD\xC3\xA9"}}));
  EXPECT_THAT(r.Serialize(), HasSubstr("g{v=\"ok\xEF\xBF\xBD\xC3\xA9\"} 1\n"));
}

TEST(RegistryTest, FormatsSpecialAndLargeValues) {
  Registry r;
  r.GetGauge("g", "h", {{"k", "a"}}).Set(std::numeric_limits<double>::infinity());
  r.GetGauge("g", "h", {{"k", "b"}}).Set(-std::numeric_limits<double>::infinity());
  r.GetGauge("g", "h", {{"k", "d"}}).Set(0.1);
  r.GetGauge("g", "h", {{"k", "f"}}).Set(123456789012);
  const std::string text = r.Serialize();
  EXPECT_THAT(text, HasSubstr("g{k=\"a\"} +Inf\n"));
  EXPECT_THAT(text, HasSubstr("g{k=\"b\"} -Inf\n"));
  EXPECT_THAT(text, HasSubstr("g{k=\"d\"} 0.1\n"));
  EXPECT_THAT(text, HasSubstr("g{k=\"f\"} 123456789012\n"));
}

TEST(HistogramTest, BucketsAreSortedDeduplicatedAndLabelsComeBeforeLe) {
  Registry r;
  // Unsorted, duplicated, +Inf and NaN bounds would make prometheus::Histogram throw.
  Histogram& h = r.GetHistogram("h_seconds", "h",
                                {4, 1, 2, 2, std::numeric_limits<double>::infinity(), std::nan("")},
                                {{"method", "Get"}});
  for (double v : {0.0, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, -1.0}) h.Observe(v);
  EXPECT_EQ(Lines(r.Serialize()), (std::multiset<std::string>{
                                      "# HELP h_seconds h",
                                      "# TYPE h_seconds histogram",
                                      "h_seconds_bucket{method=\"Get\",le=\"1\"} 3",
                                      "h_seconds_bucket{method=\"Get\",le=\"2\"} 5",
                                      "h_seconds_bucket{method=\"Get\",le=\"4\"} 7",
                                      "h_seconds_bucket{method=\"Get\",le=\"+Inf\"} 8",
                                      "h_seconds_sum{method=\"Get\"} 15.5",
                                      "h_seconds_count{method=\"Get\"} 8",
                                  }));
}

TEST(BucketsTest, ExponentialAndLinear) {
  EXPECT_EQ(ExponentialBuckets(0.001, 10, 4), (std::vector<double>{0.001, 0.01, 0.1, 1}));
  EXPECT_EQ(LinearBuckets(1, 2, 3), (std::vector<double>{1, 3, 5}));
}

// prometheus-cpp throws std::invalid_argument on most of these; the registry must not.
TEST(RegistryTest, ProgrammingErrorsReturnDetachedMetricsAndNeverThrow) {
  Registry r;
  r.GetCounter("used_total", "h").Increment(5);
  EXPECT_NO_THROW({
    // A type clash: the gauge works but is never exported; the counter is untouched.
    Gauge& clash = r.GetGauge("used_total", "h");
    clash.Set(99);
    EXPECT_EQ(clash.Value(), 99);
    r.GetHistogram("used_total", "h", {1}).Observe(1);
    // Bad metric names, bad label names, duplicate labels, "le" on a histogram, other buckets.
    r.GetCounter("1starts_with_digit", "h").Increment();
    r.GetCounter("has-dash", "h").Increment();
    r.GetCounter("", "h").Increment();
    r.GetGauge("ok_gauge", "h", {{"bad-label", "x"}}).Set(1);
    r.GetGauge("ok_gauge", "h", {{"__reserved", "x"}}).Set(1);
    r.GetGauge("ok_gauge", "h", {{"", "x"}}).Set(1);
    r.GetGauge("ok_gauge", "h", {{"a", "x"}, {"a", "y"}}).Set(1);
    r.GetHistogram("hist", "h", {1}, {{"le", "x"}}).Observe(1);
    r.GetHistogram("hist2", "h", {1}).Observe(1);
    r.GetHistogram("hist2", "h", {1, 2}).Observe(1);  // other buckets: detached
    r.GetHistogram("hist2", "h", {1}).Observe(1);     // the exported one again
    r.RemoveSeries("ok_gauge", {{"bad-label", "x"}});
    r.RemoveSeries("bad name", {});
  });
  EXPECT_EQ(Lines(r.Serialize()), (std::multiset<std::string>{
                                      "# HELP hist2 h",
                                      "# TYPE hist2 histogram",
                                      "hist2_bucket{le=\"1\"} 2",
                                      "hist2_bucket{le=\"+Inf\"} 2",
                                      "hist2_sum 2",
                                      "hist2_count 2",
                                      "# HELP used_total h",
                                      "# TYPE used_total counter",
                                      "used_total 5",
                                  }));
}

TEST(RegistryTest, RemoveSeriesStopsExportAndALaterGetStartsAgainFromZero) {
  Registry r;
  r.GetGauge("job_step", "h", {{"job", "jobs/a"}}).Set(3);
  r.GetGauge("job_step", "h", {{"job", "jobs/b"}}).Set(4);
  r.GetCounter("job_bytes_total", "h", {{"job", "jobs/a"}}).Increment(10);
  r.GetHistogram("job_wait_seconds", "h", {1}, {{"job", "jobs/a"}}).Observe(0.5);
  r.RemoveSeries("job_step", {{"job", "jobs/a"}});
  r.RemoveSeries("job_bytes_total", {{"job", "jobs/a"}});
  r.RemoveSeries("job_wait_seconds", {{"job", "jobs/a"}});
  r.RemoveSeries("job_step", {{"job", "jobs/unknown"}});  // ignored
  r.RemoveSeries("no_such_metric", {});                   // ignored
  std::string text = r.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("jobs/a")));
  EXPECT_THAT(text, HasSubstr("job_step{job=\"jobs/b\"} 4\n"));
  // Removing an unknown series did not create it.
  EXPECT_THAT(text, Not(HasSubstr("jobs/unknown")));
  // Families with no series left are not exported at all, HELP and TYPE included.
  EXPECT_THAT(text, Not(HasSubstr("job_bytes_total")));
  EXPECT_THAT(text, Not(HasSubstr("job_wait_seconds")));
  // Fetched again, a removed series is a new one.
  EXPECT_EQ(r.GetCounter("job_bytes_total", "h", {{"job", "jobs/a"}}).Value(), 0);
  r.GetGauge("job_step", "h", {{"job", "jobs/a"}}).Set(5);
  EXPECT_THAT(r.Serialize(), HasSubstr("job_step{job=\"jobs/a\"} 5\n"));
  r.RemoveSeries("job_step", {{"job", "jobs/a"}});
  r.RemoveSeries("job_step", {{"job", "jobs/b"}});
  r.RemoveSeries("job_bytes_total", {{"job", "jobs/a"}});
  EXPECT_EQ(r.Serialize(), "");
}

TEST(RegistryTest, CollectHooksRunBeforeEveryScrapeInOrder) {
  Registry r;
  int calls = 0;
  std::vector<int> order;
  r.AddCollectHook([&] {
    ++calls;
    order.push_back(1);
    // Hooks run outside the registry lock, so they may create, set and remove series.
    r.GetGauge("live_value", "Refreshed by a hook.").Set(calls * 10);
    if (calls == 2) r.RemoveSeries("stale", {});
  });
  r.AddCollectHook([&] { order.push_back(2); });
  r.GetGauge("stale", "h").Set(1);
  EXPECT_THAT(r.Serialize(), HasSubstr("live_value 10\n"));
  // The endpoint's collectable runs them too.
  const std::vector<prometheus::MetricFamily> families = r.Collectable()->Collect();
  bool found = false;
  for (const prometheus::MetricFamily& f : families) {
    EXPECT_NE(f.name, "stale");
    if (f.name != "live_value") continue;
    found = true;
    ASSERT_EQ(f.metric.size(), 1u);
    EXPECT_EQ(f.metric[0].gauge.value, 20);
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 1, 2}));
}

TEST(RegistryTest, ConcurrentUpdatesAndScrapesAreExact) {
  Registry r;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
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
  const prometheus::ClientMetric h = r.GetHistogram("size_bytes", "h", {10, 100}).Collect();
  EXPECT_EQ(h.histogram.sample_count, static_cast<uint64_t>(kThreads) * kPerThread);
  // Per thread, i % 200 in 0..10 is 11 of every 200 values, 0..100 is 101 of every 200.
  const uint64_t per = kPerThread / 200;
  ASSERT_EQ(h.histogram.bucket.size(), 3u);
  EXPECT_EQ(h.histogram.bucket[0].cumulative_count, kThreads * per * 11);
  EXPECT_EQ(h.histogram.bucket[1].cumulative_count, kThreads * per * 101);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(r.GetCounter("ops_total", "h", {{"kind", "t" + std::to_string(t)}}).Value(),
              kPerThread * 0.5);
  }
}

// The real Prometheus tool agrees that the exposition parses and passes its lint rules, with the
// awkward cases in it (escapes, invalid UTF-8, infinities, histograms with labels).
// tests/integration/metrics_exposition_test.cc checks loomd's and a worker's real ones.
TEST(RegistryTest, PromtoolAcceptsTheExposition) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool is not on PATH; install the Debian package prometheus to run this";
  }
  Registry r;
  r.GetCounter("loom_launches_total", "Rank processes launched.", {{"node", "n\"1\\\n"}})
      .Increment();
  r.GetGauge("loom_queue_depth", "Jobs waiting.\nSecond line \\ backslash.").Set(-3.5);
  r.GetGauge("loom_nodes", "Nodes by state.", {{"state", "ready"}}).Set(2);
  r.GetGauge("loom_nodes", "Nodes by state.", {{"state", "lost"}})
      .Set(std::numeric_limits<double>::infinity());
  r.GetHistogram("loom_scheduling_latency_seconds", "Latency.", ExponentialBuckets(1e-4, 10, 5),
                 {{"kind", "gpu"}})
      .Observe(0.003);
  r.GetGauge("loom_utf8_info", "Odd bytes.", {{"v", std::string("\xff\xfe", 2)}}).Set(1);
  const std::string text = r.Serialize();
  const std::string path = testing::TempDir() + "/promtool_input.prom";
  {
    std::ofstream out(path);
    out << text;
  }
  const std::string cmd = "promtool check metrics < '" + path + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << "promtool said:\n" << output << "\non:\n" << text;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace loom::metrics
