// The API <-> planner mapping (server/planner_service): a spec and a cluster description become
// a ranked PlanJobResponse; the live cluster's nodes become devices; bad input becomes an error
// that names the field or the alternative.
#include "server/planner_service/plan_mapping.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/planner_service/cluster_devices.h"

namespace loom::planner_service {
namespace {

using ::testing::HasSubstr;

// DESIGN.md's cluster: 64 nodes × 8 H100-SXM.
v1::ClusterDescription H100Cluster(int nodes = 64) {
  v1::ClusterDescription c;
  c.set_nodes(nodes);
  c.set_gpus_per_node(8);
  c.mutable_gpu()->set_model("H100-SXM");
  c.mutable_gpu()->set_memory_gib(80);
  c.mutable_gpu()->set_peak_tflops(989);
  c.set_intra_node_gb_per_s(450);
  c.set_inter_node_gb_per_s(400);
  return c;
}

v1::JobSpec GpuSpec(const std::string& preset, int gpus) {
  v1::JobSpec spec;
  spec.mutable_model()->set_preset(preset);
  spec.mutable_resources()->set_gpus(gpus);
  spec.mutable_parallelism()->mutable_auto_();
  return spec;
}

TEST(PlanMappingTest, SpecAndClusterGiveARankedResponseOfFeasiblePlans) {
  absl::StatusOr<planner::DeviceSpec> cluster = DevicesFromCluster(H100Cluster());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(cluster->count, 512);
  v1::JobSpec spec = GpuSpec("gpt-7b", 64);
  spec.mutable_train()->set_global_batch_tokens(512 * 2048);
  absl::StatusOr<v1::PlanJobResponse> response = PlanJobOnDevices(spec, *cluster, 5);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_FALSE(response->plans().empty());
  EXPECT_LE(response->plans_size(), 5);
  EXPECT_FALSE(response->has_constrained());
  EXPECT_EQ(response->global_batch_sequences(), 512);
  EXPECT_THAT(response->devices(), HasSubstr("64 × H100-SXM"));
  double previous = 0;
  for (const v1::Plan& plan : response->plans()) {
    const v1::Layout& l = plan.layout();
    EXPECT_EQ(l.data() * l.tensor() * l.pipeline(), 64);
    EXPECT_EQ(32 % l.tensor(), 0) << "tp must divide the 32 heads";
    EXPECT_EQ(int64_t{l.data()} * l.micro_batch() * l.num_micro_batches(), 512);
    EXPECT_LE(plan.memory().total(), plan.memory().device());
    EXPECT_EQ(plan.memory().device(), uint64_t{80} << 30);
    EXPECT_GT(plan.step_seconds(), 0);
    EXPECT_GE(plan.step_seconds(), previous);  // fastest first
    previous = plan.step_seconds();
    EXPECT_GT(plan.mfu(), 0);
    EXPECT_LT(plan.mfu(), 1);
    const v1::PlanPhases& p = plan.phases();
    EXPECT_NEAR(p.forward() + p.backward() + p.optimizer() + p.comm_exposed() + p.bubble(),
                plan.step_seconds(), 1e-9 + 1e-6 * plan.step_seconds());
    EXPECT_EQ(l.blocks_per_stage_size(), l.pipeline());
    EXPECT_FALSE(plan.reasons().empty());
  }
  EXPECT_THAT(response->plans(0).reasons(0), HasSubstr("fastest"));
}

TEST(PlanMappingTest, AFixedTensorSizeIsEvaluatedBesideTheBestPlan) {
  planner::DeviceSpec cluster = *DevicesFromCluster(H100Cluster(2));
  v1::JobSpec spec = GpuSpec("gpt2-1.5b", 16);
  spec.mutable_parallelism()->clear_auto_();
  spec.mutable_parallelism()->set_tensor(1);
  spec.mutable_parallelism()->set_pipeline(2);
  absl::StatusOr<v1::PlanJobResponse> response = PlanJobOnDevices(spec, cluster, 3);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_TRUE(response->has_constrained());
  EXPECT_EQ(response->constrained().layout().tensor(), 1);
  EXPECT_EQ(response->constrained().layout().pipeline(), 2);
  EXPECT_EQ(response->constrained().layout().data(), 8);
  ASSERT_FALSE(response->plans().empty());
  EXPECT_LE(response->plans(0).step_seconds(), response->constrained().step_seconds());
  // The default batch follows the spec's layout: 8 sequences per data-parallel rank.
  EXPECT_EQ(response->global_batch_sequences(), 64);
}

TEST(PlanMappingTest, AModelThatFitsNoLayoutNamesAnAlternative) {
  planner::DeviceSpec cluster = *DevicesFromCluster(H100Cluster(1));
  absl::StatusOr<v1::PlanJobResponse> response =
      PlanJobOnDevices(GpuSpec("gpt-1t", 8), cluster, 5);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(response.status().message()), HasSubstr("needs at least"));
}

TEST(PlanMappingTest, BadSpecsNameTheField) {
  planner::DeviceSpec cluster = *DevicesFromCluster(H100Cluster(2));
  struct Case {
    std::string name;
    v1::JobSpec spec;
    absl::StatusCode code;
    std::string text;
  };
  std::vector<Case> cases;
  {
    v1::JobSpec s = GpuSpec("gpt2-124m", 32);
    cases.push_back({"too many gpus", s, absl::StatusCode::kFailedPrecondition,
                     "spec.resources.gpus: 32 requested but the cluster has 16"});
  }
  {
    v1::JobSpec s = GpuSpec("gpt2-124m", 12);
    cases.push_back({"partial node", s, absl::StatusCode::kInvalidArgument,
                     "not a whole number of nodes of 8 devices; use 8 or 16"});
  }
  {
    v1::JobSpec s = GpuSpec("gpt2-9000", 8);
    cases.push_back({"preset", s, absl::StatusCode::kInvalidArgument, "spec.model.preset"});
  }
  {
    v1::JobSpec s = GpuSpec("gpt2-124m", 8);
    s.mutable_train()->set_global_batch_tokens(1000);
    cases.push_back({"batch", s, absl::StatusCode::kInvalidArgument,
                     "spec.train.global_batch_tokens: 1000 is not a multiple of the sequence "
                     "length 1024; use 1024"});
  }
  {
    v1::JobSpec s = GpuSpec("gpt2-124m", 0);
    s.mutable_resources()->set_cpu_devices(2);
    cases.push_back({"kind", s, absl::StatusCode::kFailedPrecondition,
                     "spec.resources.cpu_devices"});
  }
  {
    v1::JobSpec s = GpuSpec("gpt2-124m", 8);
    s.mutable_parallelism()->set_tensor(5);
    cases.push_back({"auto and tensor", s, absl::StatusCode::kInvalidArgument,
                     "spec.parallelism"});
  }
  for (const Case& c : cases) {
    absl::StatusOr<v1::PlanJobResponse> response = PlanJobOnDevices(c.spec, cluster, 0);
    ASSERT_FALSE(response.ok()) << c.name;
    EXPECT_EQ(response.status().code(), c.code) << c.name << ": " << response.status();
    EXPECT_THAT(std::string(response.status().message()), HasSubstr(c.text)) << c.name;
  }
  EXPECT_EQ(PlanJobOnDevices(GpuSpec("gpt2-124m", 8), cluster, 51).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlanMappingTest, ClusterDescriptionsAreChecked) {
  v1::ClusterDescription c = H100Cluster();
  c.set_nodes(0);
  EXPECT_THAT(std::string(DevicesFromCluster(c).status().message()), HasSubstr("cluster.nodes"));
  c = H100Cluster();
  c.mutable_gpu()->set_model("B300");
  c.mutable_gpu()->set_memory_gib(0);
  EXPECT_THAT(std::string(DevicesFromCluster(c).status().message()),
              HasSubstr("give memory_gib and peak_tflops"));
  c.mutable_gpu()->set_memory_gib(288);
  c.mutable_gpu()->set_peak_tflops(2500);
  absl::StatusOr<planner::DeviceSpec> custom = DevicesFromCluster(c);
  ASSERT_TRUE(custom.ok()) << custom.status();
  EXPECT_EQ(custom->model, "B300");
  EXPECT_DOUBLE_EQ(custom->peak_flops, 2500e12);
  c = H100Cluster();
  c.set_inter_node_gb_per_s(-1);
  EXPECT_THAT(std::string(DevicesFromCluster(c).status().message()),
              HasSubstr("cluster.inter_node_gb_per_s"));
}

TEST(PlanMappingTest, ReportedModelNamesMapToTheCatalog) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  EXPECT_EQ(CatalogModelName("NVIDIA H100 80GB HBM3", 0), "H100-SXM");
  EXPECT_EQ(CatalogModelName("NVIDIA H200", 141 * kGiB), "H200");
  EXPECT_EQ(CatalogModelName("NVIDIA A100-SXM4-40GB", 40 * kGiB), "A100-40GB");
  EXPECT_EQ(CatalogModelName("NVIDIA A100-SXM4-80GB", 0), "A100-80GB");
  EXPECT_EQ(CatalogModelName("cpu", 0), "cpu");
  EXPECT_EQ(CatalogModelName("Tesla T4", 16 * kGiB), "");
}

v1::Node NodeWith(const std::string& id, v1::DeviceKind kind, const std::string& model, int n,
                  v1::NodeState state = v1::NODE_STATE_READY) {
  v1::Node node;
  node.set_name("nodes/" + id);
  node.set_state(state);
  for (int i = 0; i < n; ++i) {
    v1::Device* d = node.add_devices();
    d->set_kind(kind);
    d->set_index(i);
    d->set_model(model);
  }
  return node;
}

TEST(PlanMappingTest, TheLiveClusterIsItsReadyNodes) {
  const std::vector<v1::Node> nodes = {
      NodeWith("a", v1::DEVICE_KIND_GPU, "NVIDIA H200", 8),
      NodeWith("b", v1::DEVICE_KIND_GPU, "NVIDIA H200", 8),
      NodeWith("c", v1::DEVICE_KIND_GPU, "NVIDIA H200", 8, v1::NODE_STATE_LOST),
      NodeWith("d", v1::DEVICE_KIND_CPU, "cpu", 4)};
  absl::StatusOr<planner::DeviceSpec> gpus = DevicesFromNodes(nodes, v1::DEVICE_KIND_GPU);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ(gpus->model, "H200");
  EXPECT_EQ(gpus->count, 16);
  EXPECT_EQ(gpus->per_node, 8);
  absl::StatusOr<planner::DeviceSpec> cpus = DevicesFromNodes(nodes, v1::DEVICE_KIND_CPU);
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  EXPECT_EQ(cpus->model, "cpu");
  EXPECT_EQ(cpus->count, 4);

  const std::vector<v1::Node> unknown = {NodeWith("t", v1::DEVICE_KIND_GPU, "Tesla T4", 4)};
  absl::Status s = DevicesFromNodes(unknown, v1::DEVICE_KIND_GPU).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("Tesla T4"));
  EXPECT_EQ(DevicesFromNodes({}, v1::DEVICE_KIND_CPU).status().code(),
            absl::StatusCode::kFailedPrecondition);

  v1::PlanJobRequest request;
  *request.mutable_spec() = GpuSpec("gpt2-350m", 16);
  absl::StatusOr<v1::PlanJobResponse> response = PlanJob(request, nodes);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(response->devices(), HasSubstr("16 × H200"));
  EXPECT_EQ(PlanJob(v1::PlanJobRequest(), nodes).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::planner_service
