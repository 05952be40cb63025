// calibration_bench: predicted versus measured step time for CPU jobs this machine can run, before
// and after calibration (issue 6). For each configuration it runs loom-train standalone (one CPU
// process, fp32, as a CPU device of loomd runs it) and takes the median step time and phases of
// the steps after a warmup of 2, exactly as loomd's StepTimeWindow does; the planner predicts the
// same job (EvaluateLayout on one "cpu" device, the catalog's efficiency table). Calibration then
// goes through loomd's own code (calibration::RatiosOf and Fold, then ScaleEfficiency):
//  - "catalog": the prediction with the catalog's table, as before this issue;
//  - "calibrated": the prediction after folding in every *other* configuration, in order
//    (leave-one-out: the configuration's own measurement is not used to predict it); compute
//    and optim are the scales it used (forward/backward/bubble and the optimizer phase).
// Ratios are measured / predicted (fwd, bwd, opt: per phase, against the catalog). Not a test:
// run by hand, record in docs/benchmarks.md.
//
//   calibration_bench [--loom-train PATH] [--steps N] [--rounds R]
// PATH defaults to build/bin/loom-train (run from the repository root); N timed steps per run
// (default 8); R rounds over all configurations, interleaved, pooled per configuration
// (default 2).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/calibration/calibration.h"
#include "server/planner/device_spec.h"
#include "server/planner/layout_evaluator.h"
#include "server/planner/model_shape.h"

namespace {

using loom::planner::ModelShape;

constexpr int kWarmupSteps = 2;  // StepTimeWindow::kWarmupSteps

struct Config {
  std::string name;
  ModelShape model;   // seq_len: the tokens per sequence trained
  std::string flags;  // loom-train's model flags
  int micro_batch;
  int micro_batches;
};

struct Measured {
  double step = 0, forward = 0, backward = 0, optimizer = 0, comm = 0, data = 0;
  int steps = 0;
};

// The timed steps of every run of one configuration.
struct Samples {
  std::vector<double> step, forward, backward, optimizer, comm, data;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The number after "\"key\":" in a JSON line (the progress lines are flat enough for this).
double Field(const std::string& line, const std::string& key) {
  const std::string pattern = absl::StrCat("\"", key, "\":");
  const size_t at = line.find(pattern);
  if (at == std::string::npos) return 0;
  return std::strtod(line.c_str() + at + pattern.size(), nullptr);
}

// Runs loom-train for `c` (its progress lines come on stdout) and appends the steps after the
// warmup to `out`; false when it fails.
bool Run(const std::string& loom_train, const Config& c, int timed_steps, Samples& out) {
  const int steps = kWarmupSteps + timed_steps;
  const std::string command = absl::StrCat(
      "OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 ", loom_train, " ", c.flags,
      " --data-builtin tiny-corpus --steps ", steps, " --seq-len ", c.model.seq_len, " --batch ",
      c.micro_batch, " --global-batch-tokens ",
      int64_t{c.model.seq_len} * c.micro_batch * c.micro_batches, " --quiet 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return false;
  char buffer[8192];
  int seen = 0;
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    const std::string line(buffer);
    if (line.find("\"event\":\"step\"") == std::string::npos) continue;
    if (++seen <= kWarmupSteps) continue;
    out.step.push_back(Field(line, "step_seconds"));
    out.forward.push_back(Field(line, "forward"));
    out.backward.push_back(Field(line, "backward"));
    out.optimizer.push_back(Field(line, "optimizer"));
    out.comm.push_back(Field(line, "comm_exposed"));
    out.data.push_back(Field(line, "data"));
  }
  return pclose(pipe) == 0 && seen == steps;
}

// The medians over every run, as StepTimeWindow takes them.
Measured MedianOf(const Samples& s) {
  Measured m;
  m.steps = static_cast<int>(s.step.size());
  m.step = Median(s.step);
  m.forward = Median(s.forward);
  m.backward = Median(s.backward);
  m.optimizer = Median(s.optimizer);
  m.comm = Median(s.comm);
  m.data = Median(s.data);
  return m;
}

// The prediction for `c` on one "cpu" device, the catalog's table scaled by `calibration`.
loom::planner::Evaluation Predict(const Config& c, const loom::v1::PlanCalibration& calibration) {
  loom::planner::DeviceSpec d = *loom::planner::DefaultDevice("cpu", 1, 1);
  d.efficiency = loom::planner::ScaleEfficiency(
      d.efficiency, calibration.compute_scale(), 1.0,
      calibration.optimizer_jobs() > 0 ? calibration.optimizer_scale() : 0.0);
  loom::planner::Layout l;
  l.micro_batch = c.micro_batch;
  l.num_micro_batches = c.micro_batches;
  return loom::planner::EvaluateLayout(c.model, loom::planner::Precision::kFp32, d, l);
}

// The PlanCheck loomd would hold for `c` planned with the catalog's table.
loom::v1::PlanCheck CheckOf(const loom::planner::Evaluation& e, const Measured& m) {
  loom::v1::PlanCheck check;
  check.set_predicted_step_seconds(e.time.total);
  check.mutable_predicted_phases()->set_forward(e.time.forward);
  check.mutable_predicted_phases()->set_backward(e.time.backward);
  check.mutable_predicted_phases()->set_optimizer(e.time.optimizer);
  check.mutable_predicted_phases()->set_comm_exposed(e.time.comm_exposed);
  check.mutable_predicted_phases()->set_bubble(e.time.bubble);
  check.set_measured_step_seconds(m.step);
  check.set_measured_steps(m.steps);
  check.mutable_measured_phases()->set_forward(m.forward);
  check.mutable_measured_phases()->set_backward(m.backward);
  check.mutable_measured_phases()->set_optimizer(m.optimizer);
  check.mutable_measured_phases()->set_comm_exposed(m.comm);
  check.set_measured_data_seconds(m.data);
  return check;
}

ModelShape Shape(const std::string& name, int layers, int hidden, int heads, int seq, int vocab) {
  ModelShape m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.seq_len = seq;
  m.vocab = vocab;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string loom_train = "build/bin/loom-train";
  int timed_steps = 8;
  int rounds = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--loom-train") loom_train = argv[i + 1];
    if (flag == "--steps") timed_steps = std::max(3, std::atoi(argv[i + 1]));
    if (flag == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  const std::string custom = "--layers 4 --hidden 256 --heads 4 --model-seq-len 128 --vocab 2048";
  const std::vector<Config> configs = {
      {"tiny b=4", Shape("tiny", 2, 64, 4, 64, 256), "--preset tiny", 4, 1},
      {"tiny b=16 k=2", Shape("tiny", 2, 64, 4, 64, 256), "--preset tiny", 16, 2},
      {"L4 h256 T128 b=4", Shape("custom", 4, 256, 4, 128, 2048), custom, 4, 1},
      {"L4 h256 T128 b=1", Shape("custom", 4, 256, 4, 128, 2048), custom, 1, 2},
      {"small T64 b=2", Shape("small", 6, 384, 6, 64, 50257), "--preset small", 2, 1},
  };

  // Rounds interleave the configurations, so that a burst of load on the shared machine spreads
  // over all of them instead of falling on one.
  std::vector<Samples> samples(configs.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < configs.size(); ++i) {
      if (!Run(loom_train, configs[i], timed_steps, samples[i])) {
        std::fprintf(stderr, "calibration_bench: %s: %s failed or reported too few steps\n",
                     configs[i].name.c_str(), loom_train.c_str());
        return 1;
      }
    }
  }
  const loom::calibration::CalibrationPolicy policy;
  loom::v1::PlanCalibration catalog;
  catalog.set_device_model("cpu");
  catalog.set_compute_scale(1.0);
  std::vector<Measured> measured;
  std::vector<loom::v1::PlanCheck> checks;
  for (size_t i = 0; i < configs.size(); ++i) {
    measured.push_back(MedianOf(samples[i]));
    checks.push_back(CheckOf(Predict(configs[i], catalog), measured.back()));
  }

  std::printf("%-18s %6s %10s %10s %8s %6s %6s %6s %10s %8s %8s %8s\n", "config", "steps",
              "measured_s", "catalog_s", "ratio", "fwd", "bwd", "opt", "calib_s", "ratio",
              "compute", "optim");
  std::vector<double> before, after, whole_step;
  for (size_t i = 0; i < configs.size(); ++i) {
    // From every other configuration, in order: by phase (as loomd does when step reports carry
    // phases), and from the step time alone (as it does without phase telemetry).
    loom::v1::PlanCalibration c = catalog, step_only = catalog;
    for (size_t j = 0; j < configs.size(); ++j) {
      if (j == i) continue;
      if (auto r = loom::calibration::RatiosOf(checks[j], catalog, policy)) {
        c = loom::calibration::Fold(c, *r, policy);
      }
      loom::v1::PlanCheck no_phases = checks[j];
      no_phases.clear_measured_phases();
      if (auto r = loom::calibration::RatiosOf(no_phases, catalog, policy)) {
        step_only = loom::calibration::Fold(step_only, *r, policy);
      }
    }
    const double predicted = checks[i].predicted_step_seconds();
    const double calibrated = Predict(configs[i], c).time.total;
    before.push_back(measured[i].step / predicted);
    after.push_back(measured[i].step / calibrated);
    whole_step.push_back(measured[i].step / Predict(configs[i], step_only).time.total);
    const loom::v1::PlanPhases& p = checks[i].predicted_phases();
    std::printf("%-18s %6d %10.4f %10.4f %8.2f %6.1f %6.1f %6.1f %10.4f %8.2f %8.2f %8.2f\n",
                configs[i].name.c_str(), measured[i].steps, measured[i].step, predicted,
                before.back(), measured[i].forward / p.forward(),
                measured[i].backward / p.backward(), measured[i].optimizer / p.optimizer(),
                calibrated, after.back(), c.compute_scale(), c.optimizer_scale());
  }
  loom::v1::PlanCalibration all = catalog;
  for (const loom::v1::PlanCheck& check : checks) {
    if (auto r = loom::calibration::RatiosOf(check, catalog, policy)) {
      all = loom::calibration::Fold(all, *r, policy);
    }
  }
  auto worst = [](const std::vector<double>& ratios) {
    double w = 1;
    for (double r : ratios) w = std::max(w, std::max(r, 1 / r));
    return w;
  };
  std::printf(
      "median ratio: catalog %.2f, calibrated (leave-one-out) %.2f; worst factor off: "
      "catalog %.2f, calibrated %.2f; cpu scales after all %d jobs: compute %.2f, optimizer "
      "%.2f\n",
      Median(before), Median(after), worst(before), worst(after), all.jobs(), all.compute_scale(),
      all.optimizer_scale());
  std::printf("calibrated from the step time alone (no phases): ratios");
  for (double r : whole_step) std::printf(" %.2f", r);
  std::printf("; median %.2f, worst factor off %.2f\n", Median(whole_step), worst(whole_step));
  return 0;
}
