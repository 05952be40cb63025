// AgentPriority: the worker runs at a higher CPU priority than the ranks it starts.
//
// A gang's start is the worker's work (preparing the job directory, cloning and exec'ing each
// rank, reporting RUNNING), and the ranks it has already started compete with it for the same
// cores. At equal priority a node whose cores the ranks fill also delays the worker's
// heartbeats, log forwarding and stop requests. So the worker lowers its own nice value by a
// few levels at start (loom-worker --raise-priority=N) and gives each rank the nice value the
// worker was started with (LaunchRequest::nice): the ranks keep exactly the priority the
// operator started the worker at, and the worker's own threads, which use little CPU, are served
// first. Lowering a nice value needs CAP_SYS_NICE (root has it, and a worker that switches the
// ranks' user runs as root); without it the worker runs at its ranks' priority, as before.
//
// Threading: RaiseAgentPriority() is called once, early in main. It changes every thread the
// process has at that moment, and threads started later inherit the value from their creator.
#pragma once

#include <optional>
#include <string>

namespace loom::worker {

struct AgentPriority {
  // The nice value the ranks get (the process's before the raise); nullopt when the worker did
  // not raise its priority (levels was 0, or the system refused), so ranks inherit the worker's.
  std::optional<int> rank_nice;
  // One line for the worker's log: what was done, or why not.
  std::string note;
};

// Lowers the nice value of every thread of this process by `levels` (0 to 19), bounded at -20.
AgentPriority RaiseAgentPriority(int levels);

}  // namespace loom::worker
