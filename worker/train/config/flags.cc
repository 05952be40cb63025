#include "worker/train/config/flags.h"

#include <cstdlib>
#include <string_view>

#include "worker/train/error.h"

namespace loom::train {
namespace {

// A flag that sets one spec field: --steps -> train.steps.
struct SpecFlag {
  const char* flag;
  const char* section;
  const char* field;
};

constexpr SpecFlag kSpecFlags[] = {
    {"--name", "", "name"},
    {"--preset", "model", "preset"},
    {"--layers", "model", "layers"},
    {"--hidden", "model", "hidden"},
    {"--heads", "model", "heads"},
    {"--model-seq-len", "model", "seq_len"},
    {"--vocab", "model", "vocab"},
    {"--data", "data", "path"},
    {"--data-builtin", "data", "builtin"},
    {"--val-data", "data", "val_path"},
    {"--steps", "train", "steps"},
    {"--global-batch-tokens", "train", "global_batch_tokens"},
    {"--lr", "train", "lr"},
    {"--precision", "train", "precision"},
    {"--seed", "train", "seed"},
    {"--warmup", "train", "warmup_steps"},
    {"--min-lr-ratio", "train", "min_lr_ratio"},
    {"--weight-decay", "train", "weight_decay"},
    {"--grad-clip", "train", "grad_clip"},
    {"--eval-every", "train", "eval_every"},
    {"--seq-len", "train", "seq_len"},
    {"--attention", "train", "attention"},
    {"--batch", "parallelism", "micro_batch"},
    {"--dp-bucket-mb", "parallelism", "dp_bucket_mb"},
    {"--dp-overlap", "parallelism", "dp_overlap"},
    {"--checkpoint-every", "checkpoint", "every_steps"},
};

// Sets overlay[section][field] = text (a string value: the spec reader converts).
void SetField(Value* overlay, const std::string& section, const std::string& field,
              const std::string& text) {
  Value scalar;
  scalar.kind = Value::Kind::kString;
  scalar.text = text;
  Value* target = overlay;
  if (!section.empty()) {
    Value* found = nullptr;
    for (auto& [k, v] : overlay->members) {
      if (k == section) found = &v;
    }
    if (found == nullptr) {
      Value obj;
      obj.kind = Value::Kind::kObject;
      overlay->members.emplace_back(section, std::move(obj));
      found = &overlay->members.back().second;
    }
    target = found;
  }
  for (auto& [k, v] : target->members) {
    if (k == field) {
      v = scalar;
      return;
    }
  }
  target->members.emplace_back(field, scalar);
}

}  // namespace

Flags ParseFlags(const std::vector<std::string>& args) {
  Flags flags;
  flags.overlay.kind = Value::Kind::kObject;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "-h" || arg == "--help") {
      flags.help = true;
      continue;
    }
    if (arg == "--quiet") {
      flags.quiet = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) throw BadInput(arg, "unexpected argument (see --help)");
    std::string value;
    size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      if (i + 1 >= args.size()) throw BadInput(arg, "expected a value after the flag");
      value = args[++i];
    }
    if (arg == "--spec") {
      flags.spec_path = value;
    } else if (arg == "--checkpoint-dir") {
      flags.checkpoint_dir = value;
    } else if (arg == "--export-llmc") {
      flags.export_llmc = value;
    } else if (arg == "--rendezvous-dir") {
      flags.rendezvous_dir = value;
    } else if (arg == "--device") {
      const bool cuda_n = value.rfind("cuda:", 0) == 0 && value.size() > 5 &&
                          value.find_first_not_of("0123456789", 5) == std::string::npos &&
                          value.size() <= 8;
      if (value != "cpu" && value != "cuda" && !cuda_n) {
        throw BadInput(arg, "expected cpu, cuda or cuda:N, got \"" + value + "\"");
      }
      flags.device = value;
    } else if (arg == "--init-from-llmc") {
      flags.init_from_llmc = value;
    } else {
      bool known = false;
      for (const SpecFlag& f : kSpecFlags) {
        if (arg == f.flag) {
          SetField(&flags.overlay, f.section, f.field, value);
          known = true;
        }
      }
      if (!known) throw BadInput(arg, "unknown flag (see --help)");
    }
  }
  return flags;
}

const char* FlagsUsage() {
  return R"(usage: loom-train [--spec job.yaml] [flags]

Trains a GPT-2 model on the CPU, or on CUDA GPUs in bf16 (--device cuda). Under
loom-worker the LOOM_* environment of docs/rank-contract.md (LOOM_SPEC_FILE, LOOM_LAYOUT,
LOOM_CHECKPOINT_DIR, LOOM_PROGRESS_FD, LOOM_DEVICE) configures the run; flags override the
spec.

  --spec FILE              job spec, YAML or JSON (the keys of proto/loom/v1/job.proto)
  --preset NAME            tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b
  --layers/--hidden/--heads/--model-seq-len/--vocab N   explicit model dimensions
  --data FILE              token file (llm.c layout); --val-data FILE for validation
  --data-builtin NAME      tiny-corpus
  --steps N  --batch B  --seq-len T  --global-batch-tokens N
  --lr X  --warmup N  --min-lr-ratio X  --weight-decay X  --grad-clip X  --seed S
  --eval-every N           validation loss every N steps
  --checkpoint-dir DIR     resume from the newest complete checkpoint there; save into it
  --checkpoint-every N     save every N steps (and always at the end)
  --init-from-llmc FILE    initialise from an llm.c GPT-2 model file (fp32, version 3)
  --export-llmc FILE       write the trained model as an llm.c GPT-2 model file
  --device cpu|cuda        where the model trains (default cpu; cuda:N for GPU N; under
                           loom-worker LOOM_DEVICE=cuda:N picks the GPU where this build has
                           CUDA): cuda trains in bf16 mixed precision, one rank or any
                           data x tensor x pipeline layout and ZeRO-1 over NCCL
  --attention auto|fused|unfused
                           the GPU path's attention kernels (default auto: fused where the
                           head size is a multiple of 16 up to 64)
  --quiet                  no human-readable progress on stderr
  --rendezvous-dir DIR     several ranks on one machine (or a shared file system) meet
                           there (else LOOM_RENDEZVOUS_DIR); with LOOM_RANK,
                           LOOM_WORLD_SIZE and LOOM_LAYOUT=data=D,... one process per rank;
                           without it, ranks launched by loom-worker meet through loomd
                           (LOOM_RENDEZVOUS, LOOM_JOB, LOOM_JOB_GENERATION); give each
                           standalone run a fresh DIR (or a new LOOM_JOB_GENERATION): the
                           addresses an earlier run left there would be read
  --dp-bucket-mb X         data-parallel gradient bucket size in MiB (default 25)
  --dp-overlap BOOL        all-reduce gradient buckets while backward runs (default true);
                           false waits for the whole backward first (for measurements)
  --measure-device         (alone) measure this CPU's matmul, block and optimizer rates with
                           the training kernels and print them as one JSON line (loom-worker
                           runs it when it starts; docs/rank-contract.md)

Exit status: 0 success, 2 bad configuration or input, 1 crash.
)";
}

}  // namespace loom::train
