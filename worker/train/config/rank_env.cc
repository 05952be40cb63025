#include "worker/train/config/rank_env.h"

#include <charconv>
#include <vector>

#include "worker/train/error.h"

namespace loom::train {
namespace {

// Parses a decimal integer in [lo, hi]; `what` names the variable in the error.
int64_t ParseInt(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < lo || v > hi) {
    throw BadInput(what, "expected an integer in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got \"" + text + "\"");
  }
  return v;
}

}  // namespace

namespace {

// "2/1/1" -> {2, 1, 1}.
std::vector<int> ParseBlocks(const std::string& text) {
  std::vector<int> blocks;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('/', start);
    if (end == std::string::npos) end = text.size();
    blocks.push_back(static_cast<int>(
        ParseInt(text.substr(start, end - start), "LOOM_LAYOUT blocks", 1, 1 << 20)));
    start = end + 1;
  }
  return blocks;
}

}  // namespace

Layout ParseLayout(const std::string& text) {
  Layout layout;
  constexpr int kNumKeys = 8;
  const char* keys[kNumKeys] = {"data",   "tensor",   "pipeline", "micro_batch",
                                "num_micro_batches", "blocks", "schedule", "zero1"};
  bool seen[kNumKeys] = {};
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    size_t eq = item.find('=');
    if (eq == std::string::npos) {
      throw BadInput("LOOM_LAYOUT",
                     "expected key=value items separated by commas, got \"" + text + "\"");
    }
    std::string key = item.substr(0, eq);
    std::string value = item.substr(eq + 1);
    int which = -1;
    for (int i = 0; i < kNumKeys; ++i) {
      if (key == keys[i]) which = i;
    }
    if (which < 0) {
      throw BadInput("LOOM_LAYOUT", "unknown key \"" + key +
                                        "\" (expected data, tensor, pipeline, micro_batch, "
                                        "num_micro_batches, blocks, schedule, zero1)");
    }
    if (seen[which]) throw BadInput("LOOM_LAYOUT", "key \"" + key + "\" given twice");
    seen[which] = true;
    int* ints[5] = {&layout.data, &layout.tensor, &layout.pipeline, &layout.micro_batch,
                    &layout.num_micro_batches};
    if (which < 5) {
      *ints[which] = static_cast<int>(ParseInt(value, "LOOM_LAYOUT " + key, 1, 1 << 30));
    } else if (key == "blocks") {
      layout.blocks_per_stage = ParseBlocks(value);
    } else if (key == "schedule") {
      if (value != "1f1b" && value != "gpipe") {
        throw BadInput("LOOM_LAYOUT schedule", "expected 1f1b or gpipe, got \"" + value + "\"");
      }
      layout.schedule = value;
    } else {  // zero1
      layout.zero1 = ParseInt(value, "LOOM_LAYOUT zero1", 0, 1) == 1;
    }
    start = end + 1;
  }
  if (!seen[3] || !seen[4]) {
    throw BadInput("LOOM_LAYOUT",
                   "micro_batch and num_micro_batches are required, got \"" + text + "\"");
  }
  return layout;
}

std::vector<int> EvenBlocksPerStage(int layers, int stages) {
  std::vector<int> blocks(static_cast<size_t>(stages), layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++blocks[static_cast<size_t>(s)];
  return blocks;
}

RankEnv ReadRankEnv(const std::function<const char*(const char*)>& get) {
  RankEnv env;
  auto str = [&](const char* name) -> std::string {
    const char* v = get(name);
    return v ? std::string(v) : std::string();
  };
  env.job = str("LOOM_JOB");
  if (std::string v = str("LOOM_JOB_GENERATION"); !v.empty()) {
    env.generation = ParseInt(v, "LOOM_JOB_GENERATION", 0, INT64_MAX);
  }
  if (std::string v = str("LOOM_WORLD_SIZE"); !v.empty()) {
    env.world_size = static_cast<int>(ParseInt(v, "LOOM_WORLD_SIZE", 1, 1 << 20));
  }
  if (std::string v = str("LOOM_RANK"); !v.empty()) {
    env.rank = static_cast<int>(ParseInt(v, "LOOM_RANK", 0, env.world_size - 1));
  }
  if (std::string v = str("LOOM_LOCAL_RANK"); !v.empty()) {
    env.local_rank = static_cast<int>(ParseInt(v, "LOOM_LOCAL_RANK", 0, 1 << 20));
  }
  if (std::string v = str("LOOM_DEVICE"); !v.empty()) {
    if (v.rfind("cpu:", 0) != 0 && v.rfind("cuda:", 0) != 0) {
      throw BadInput("LOOM_DEVICE", "expected cpu:N or cuda:N, got \"" + v + "\"");
    }
    env.device = v;
  }
  if (std::string v = str("LOOM_LAYOUT"); !v.empty()) {
    env.layout = ParseLayout(v);
    env.has_layout = true;
  }
  env.spec_file = str("LOOM_SPEC_FILE");
  env.checkpoint_dir = str("LOOM_CHECKPOINT_DIR");
  env.work_dir = str("LOOM_WORK_DIR");
  if (std::string v = str("LOOM_PROGRESS_FD"); !v.empty()) {
    env.progress_fd = static_cast<int>(ParseInt(v, "LOOM_PROGRESS_FD", 0, 1 << 20));
  }
  return env;
}

BatchShape ResolveBatchShape(const JobConfig& config, const RankEnv& env) {
  BatchShape shape;
  shape.T = config.seq_len;
  const int64_t sequences = config.global_batch_tokens / config.seq_len;
  if (env.has_layout) {
    const Layout& l = env.layout;
    if (int64_t{l.data} * l.tensor * l.pipeline != env.world_size) {
      throw BadInput("LOOM_LAYOUT", "data*tensor*pipeline = " +
                                        std::to_string(int64_t{l.data} * l.tensor * l.pipeline) +
                                        " but LOOM_WORLD_SIZE = " +
                                        std::to_string(env.world_size));
    }
    int64_t tokens = int64_t{shape.T} * l.data * l.micro_batch * l.num_micro_batches;
    if (tokens != config.global_batch_tokens) {
      throw BadInput(
          "LOOM_LAYOUT",
          "seq_len*data*micro_batch*num_micro_batches = " + std::to_string(tokens) +
              " but train.global_batch_tokens = " + std::to_string(config.global_batch_tokens));
    }
    const ModelDims& d = config.model;
    if (d.heads % l.tensor != 0 || (4 * d.channels) % l.tensor != 0) {
      throw BadInput("LOOM_LAYOUT tensor",
                     std::to_string(l.tensor) + " does not divide the model's " +
                         std::to_string(d.heads) + " heads (model.heads) and " +
                         std::to_string(4 * d.channels) +
                         " MLP channels (4 * model.hidden): use a tensor size that divides both");
    }
    if (l.pipeline > d.layers) {
      throw BadInput("LOOM_LAYOUT pipeline",
                     std::to_string(l.pipeline) + " stages for " + std::to_string(d.layers) +
                         " blocks (model.layers): every stage needs at least one block; use "
                         "pipeline <= " +
                         std::to_string(d.layers));
    }
    std::vector<int> blocks = l.blocks_per_stage;
    if (blocks.empty()) blocks = EvenBlocksPerStage(d.layers, l.pipeline);
    int64_t covered = 0;
    for (int b : blocks) covered += b;
    if (static_cast<int>(blocks.size()) != l.pipeline || covered != d.layers) {
      std::string given;
      for (int b : blocks) given += (given.empty() ? "" : "/") + std::to_string(b);
      throw BadInput("LOOM_LAYOUT blocks",
                     "blocks=" + given + " must give one count per stage (" +
                         std::to_string(l.pipeline) + ") summing to the model's " +
                         std::to_string(d.layers) +
                         " blocks, so that the stages cover every block once");
    }
    shape.B = l.micro_batch;
    shape.K = l.num_micro_batches;
    shape.dp_size = l.data;
    shape.tp_size = l.tensor;
    shape.pp_size = l.pipeline;
    shape.tp_rank = env.rank % l.tensor;  // rank = tp + T * (dp + D * pp)
    shape.dp_rank = (env.rank / l.tensor) % l.data;
    shape.pp_rank = env.rank / (l.tensor * l.data);
    shape.stage_bounds.assign(1, 0);
    for (int b : blocks) shape.stage_bounds.push_back(shape.stage_bounds.back() + b);
    shape.schedule = l.schedule;
    shape.zero1 = l.zero1;
    return shape;
  }
  if (env.world_size > 1) {
    throw BadInput("LOOM_LAYOUT", "LOOM_WORLD_SIZE is " + std::to_string(env.world_size) +
                                      ": several ranks need LOOM_LAYOUT to say how they split "
                                      "the work");
  }
  if (config.parallel_data > 1 || config.parallel_tensor > 1 || config.parallel_pipeline > 1) {
    throw BadInput("parallelism",
                   "data, tensor and pipeline above 1 need one process per rank: launch the "
                   "ranks with LOOM_RANK, LOOM_WORLD_SIZE and LOOM_LAYOUT (docs/rank-contract.md)");
  }
  if (config.micro_batch > 0) {
    shape.B = config.micro_batch;
  } else {
    shape.B = 1;
    for (int b = 8; b >= 1; --b) {
      if (sequences % b == 0) {
        shape.B = b;
        break;
      }
    }
  }
  if (sequences % shape.B != 0) {
    throw BadInput("parallelism.micro_batch", std::to_string(shape.B) + " does not divide " +
                                                  std::to_string(sequences) +
                                                  " sequences per step");
  }
  if (sequences / shape.B > (1 << 30)) {
    throw BadInput("train.global_batch_tokens", "too many micro-batches per step");
  }
  shape.K = static_cast<int>(sequences / shape.B);
  shape.stage_bounds = {0, config.model.layers};
  return shape;
}

}  // namespace loom::train
