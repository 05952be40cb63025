#include "server/planner/cluster_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace loom::planner {
namespace {

using ::testing::HasSubstr;

constexpr char kDesignExample[] = R"(# cluster.yaml
nodes: 64
gpus_per_node: 8
gpu: {model: H100-SXM, memory_gib: 80, peak_tflops: 989}
intra_node_gb_per_s: 450     # per GPU, one direction (NVLink)
inter_node_gb_per_s: 400     # per node, one direction (network)
)";

TEST(ClusterFileTest, ParsesTheDesignExample) {
  absl::StatusOr<DeviceSpec> d = ParseClusterYaml(kDesignExample);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->model, "H100-SXM");
  EXPECT_EQ(d->count, 512);
  EXPECT_EQ(d->per_node, 8);
  EXPECT_DOUBLE_EQ(d->memory_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(d->peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(d->intra_node_bytes_per_s, 450e9);
  EXPECT_DOUBLE_EQ(d->inter_node_bytes_per_s, 400e9);
  EXPECT_DOUBLE_EQ(d->memory_bandwidth_bytes_per_s, 3350e9);  // from the catalog
  EXPECT_TRUE(ValidateDevices(*d).ok());
}

TEST(ClusterFileTest, CatalogFillsMissingFieldsAndOverridesApply) {
  absl::StatusOr<DeviceSpec> d = ParseClusterYaml(
      "nodes: 2\ngpus_per_node: 8\ngpu: {model: A100-40GB}\n"
      "efficiency: {gemm_large: 0.6, allreduce_inter: 0.5}\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_DOUBLE_EQ(d->memory_bytes, 40 * kGiB);
  EXPECT_DOUBLE_EQ(d->peak_flops, 312e12);
  EXPECT_DOUBLE_EQ(d->efficiency.gemm_large, 0.6);
  EXPECT_DOUBLE_EQ(d->efficiency.allreduce_inter, 0.5);
  EXPECT_DOUBLE_EQ(d->efficiency.gemm_medium, 0.65);  // default kept
}

TEST(ClusterFileTest, ErrorsCarryLineColumnAndKey) {
  struct Case {
    const char* text;
    const char* expected;
  };
  for (const Case& c : {
           Case{"nodes: 2\ngpu_per_node: 8\n",
                "cluster.yaml:2:1: gpu_per_node: unknown key "
                "(did you mean \"gpus_per_node\"?)"},
           Case{"nodes: two\ngpus_per_node: 8\n",
                "cluster.yaml:1:8: nodes: expected a positive integer, got \"two\""},
           Case{"nodes: 2\ngpus_per_node: 8\ngpu: {model: H100-SXM, memory_gib: -3}\n",
                "cluster.yaml:3:"},
           Case{"nodes: 2\ngpus_per_node: 8\ngpu: {model: B200}\n",
                "gpu.memory_gib: missing; required because gpu.model \"B200\""},
           Case{"gpus_per_node: 8\n", "nodes: missing"},
           Case{"nodes: [1, 2\n", "cluster.yaml:"},
           Case{"nodes: 1\ngpus_per_node: 8\ngpu: {model: H100-SXM}\nefficiency: {p2p: 3}\n",
                "efficiency.p2p: a fraction must be in (0, 1]"},
       }) {
    absl::StatusOr<DeviceSpec> d = ParseClusterYaml(c.text);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(c.expected)) << c.text;
  }
}

TEST(ClusterFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadClusterFile("no/such/cluster.yaml").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom::planner
