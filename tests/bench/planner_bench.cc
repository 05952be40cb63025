// Planning time of the layout search (server/planner) for models from 124M to 1T parameters on
// 8 to 4,096 H100s (8 per node), median of repetitions, printed as a table with the chosen
// layout. Plain main, no framework: `planner_bench [repetitions]`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/planner/device_spec.h"
#include "server/planner/layout_search.h"
#include "server/planner/model_shape.h"

namespace {

using loom::planner::PlanLayouts;
using loom::planner::PlanRequest;

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const std::vector<std::string> models = {"gpt2-124m", "gpt2-1.5b", "gpt-7b", "gpt-13b",
                                           "gpt3-175b", "gpt-530b",  "gpt-1t"};
  const std::vector<int> device_counts = {8, 64, 512, 4096};
  std::printf("%-10s %8s %6s %10s %8s %7s  %-62s %9s %5s\n", "model", "params", "GPUs", "plan_ms",
              "layouts", "fitting", "best layout", "step_s", "MFU");
  for (const std::string& name : models) {
    for (int n : device_counts) {
      PlanRequest req;
      req.model = *loom::planner::ResolvePreset(name);
      req.devices = *loom::planner::DefaultDevice("H100-SXM", n, 8);
      req.batch.global_batch_sequences = 2048;  // 4M tokens at seq_len 2048
      std::vector<double> ms;
      std::string best = "-", error;
      int layouts = 0, fitting = 0;
      double step = 0, mfu = 0;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        absl::StatusOr<loom::planner::PlanResult> plan = PlanLayouts(req);
        const auto t1 = std::chrono::steady_clock::now();
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        layouts = 0;
        if (plan.ok()) {
          layouts = plan->layouts_evaluated;
          fitting = static_cast<int>(plan->ranked.size());
          best = loom::planner::LayoutString(plan->ranked.front().layout);
          step = plan->ranked.front().time.total;
          mfu = plan->ranked.front().mfu;
        } else {
          error = std::string(plan.status().message()).substr(0, 60);
        }
      }
      std::sort(ms.begin(), ms.end());
      const double params = loom::planner::TotalParams(req.model);
      char size[16];
      if (params < 1e9) {
        std::snprintf(size, sizeof(size), "%.0fM", params / 1e6);
      } else {
        std::snprintf(size, sizeof(size), "%.1fB", params / 1e9);
      }
      std::printf("%-10s %8s %6d %10.2f %8d %7d  %-62s %9.3f %4.0f%%\n", name.c_str(), size, n,
                  ms[ms.size() / 2], layouts, fitting, error.empty() ? best.c_str() : error.c_str(),
                  step, 100 * mfu);
    }
  }
  return 0;
}
