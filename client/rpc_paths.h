// The gRPC paths of the methods loomctl calls: the wire client's calls and the persistent
// connection's list of what it relays name them from here, so a path is written once.
#pragma once

#include <string_view>

namespace loom::client {

namespace rpc {
inline constexpr std::string_view kCreateJob = "/loom.v1.JobService/CreateJob";
inline constexpr std::string_view kGetJob = "/loom.v1.JobService/GetJob";
inline constexpr std::string_view kListJobs = "/loom.v1.JobService/ListJobs";
inline constexpr std::string_view kCancelJob = "/loom.v1.JobService/CancelJob";
inline constexpr std::string_view kWatchJob = "/loom.v1.JobService/WatchJob";
inline constexpr std::string_view kStreamJobLogs = "/loom.v1.JobService/StreamJobLogs";
inline constexpr std::string_view kPlanJob = "/loom.v1.JobService/PlanJob";
inline constexpr std::string_view kGetJobReport = "/loom.v1.JobService/GetJobReport";
inline constexpr std::string_view kGetJobTrace = "/loom.v1.JobService/GetJobTrace";
inline constexpr std::string_view kListNodes = "/loom.v1.NodeService/ListNodes";
inline constexpr std::string_view kDrainNode = "/loom.v1.NodeService/DrainNode";
inline constexpr std::string_view kDeleteNode = "/loom.v1.NodeService/DeleteNode";
inline constexpr std::string_view kCreateScaleTest = "/loom.v1.ScalingService/CreateScaleTest";
inline constexpr std::string_view kGetScaleTest = "/loom.v1.ScalingService/GetScaleTest";
}  // namespace rpc

}  // namespace loom::client
