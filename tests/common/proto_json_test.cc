// MessageToJson against protobuf's own printer (MessageToJsonString with proto field names and
// default-valued fields printed): both must give the same JSON values, which is what the ranks
// read from spec.json.
#include "common/proto_json.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "loom/v1/job.pb.h"

namespace loom {
namespace {

using google::protobuf::FieldDescriptor;

nlohmann::json Parse(const std::string& text) {
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

nlohmann::json Protobufs(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.always_print_primitive_fields = true;
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(m, &json, print).ok());
  return Parse(json);
}

void ExpectSameAsProtobufs(const google::protobuf::Message& m) {
  const nlohmann::json ours = Parse(MessageToJson(m));
  ASSERT_FALSE(ours.is_discarded()) << MessageToJson(m);
  EXPECT_EQ(ours, Protobufs(m)) << "ours: " << ours.dump() << "\nprotobuf's: " << Protobufs(m);
}

// Every sub-message present, as loom-worker writes spec.json.
void FillMessages(google::protobuf::Message* m) {
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      m->GetReflection()->MutableMessage(m, f);
    }
  }
}

v1::JobSpec EverythingSet() {
  v1::JobSpec spec;
  spec.set_name("sweep \"a\"\n\t\\ é 中 \x01");
  spec.mutable_model()->set_preset("gpt2-124m");
  spec.mutable_model()->set_layers(-3);
  spec.mutable_model()->set_hidden(std::numeric_limits<int32_t>::max());
  spec.mutable_model()->set_heads(12);
  spec.mutable_model()->set_seq_len(1024);
  spec.mutable_model()->set_vocab(50257);
  spec.mutable_data()->set_path("data/train.bin");
  spec.mutable_data()->set_val_path("data/val.bin");
  spec.mutable_train()->set_steps(std::numeric_limits<int64_t>::max());
  spec.mutable_train()->set_global_batch_tokens(-524288);
  spec.mutable_train()->set_lr(6.0e-4);
  spec.mutable_train()->set_precision("bf16");
  spec.mutable_train()->set_seed(0);  // set, at its default: still printed (presence)
  spec.mutable_train()->set_min_lr_ratio(0.1);
  spec.mutable_train()->set_weight_decay(1e-300);
  spec.mutable_train()->set_grad_clip(std::numeric_limits<double>::quiet_NaN());
  spec.mutable_train()->set_eval_every(50);
  spec.mutable_resources()->set_cpu_devices(8);
  spec.mutable_parallelism()->mutable_auto_();
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_parallelism()->set_zero1(true);
  spec.mutable_parallelism()->add_blocks_per_stage(3);
  spec.mutable_parallelism()->add_blocks_per_stage(-1);
  spec.mutable_parallelism()->set_dp_bucket_mb(std::numeric_limits<double>::infinity());
  spec.mutable_parallelism()->set_dp_overlap(false);
  spec.mutable_checkpoint()->set_every_steps(200);
  spec.mutable_checkpoint()->set_keep(0);
  spec.mutable_restart()->set_max_restarts(3);
  spec.mutable_restart()->set_backoff_seconds(-0.5);
  spec.set_priority(-7);
  (*spec.mutable_env())["OMP_NUM_THREADS"] = "4";
  (*spec.mutable_env())["QUOTE\"KEY"] = "a\\b";
  (*spec.mutable_env())[""] = "";
  spec.mutable_rebalance()->set_mode("auto");
  return spec;
}

TEST(ProtoJsonTest, AnEmptySpecWithEveryMessagePresentPrintsAsProtobufDoes) {
  v1::JobSpec spec;
  ExpectSameAsProtobufs(spec);
  FillMessages(&spec);
  ExpectSameAsProtobufs(spec);
  // The defaults are there: the ranks read every field.
  const nlohmann::json ours = Parse(MessageToJson(spec));
  EXPECT_EQ(ours["train"]["steps"], "0");  // int64 as a string
  EXPECT_EQ(ours["model"]["layers"], 0);
  EXPECT_EQ(ours["parallelism"]["blocks_per_stage"], nlohmann::json::array());
  EXPECT_FALSE(ours["train"].contains("lr"));  // optional and unset
  EXPECT_FALSE(ours["parallelism"].contains("auto"));
}

TEST(ProtoJsonTest, ASpecWithEveryFieldSetPrintsAsProtobufDoes) {
  const v1::JobSpec spec = EverythingSet();
  ExpectSameAsProtobufs(spec);
  const nlohmann::json ours = Parse(MessageToJson(spec));
  EXPECT_EQ(ours["train"]["grad_clip"], "NaN");
  EXPECT_EQ(ours["parallelism"]["dp_bucket_mb"], "Infinity");
  EXPECT_EQ(ours["train"]["steps"], "9223372036854775807");
  EXPECT_EQ(ours["env"]["QUOTE\"KEY"], "a\\b");
  EXPECT_EQ(ours["name"], spec.name());
}

TEST(ProtoJsonTest, EachOptionalFieldAlonePrintsAsProtobufDoes) {
  const v1::JobSpec full = EverythingSet();
  int optional_fields = 0;
  for (const google::protobuf::Descriptor* d :
       {v1::TrainSpec::descriptor(), v1::ParallelismSpec::descriptor(),
        v1::CheckpointSpec::descriptor(), v1::RestartSpec::descriptor()}) {
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (!f->has_presence()) continue;
      ++optional_fields;
      v1::JobSpec spec;
      FillMessages(&spec);
      // Copy the one field from the full spec into the same sub-message of `spec`.
      const FieldDescriptor* holder = v1::JobSpec::descriptor()->FindFieldByName(
          d == v1::TrainSpec::descriptor()         ? "train"
          : d == v1::ParallelismSpec::descriptor() ? "parallelism"
          : d == v1::CheckpointSpec::descriptor()  ? "checkpoint"
                                                   : "restart");
      const google::protobuf::Message& from = full.GetReflection()->GetMessage(full, holder);
      google::protobuf::Message* to = spec.GetReflection()->MutableMessage(&spec, holder);
      to->CopyFrom(from);
      for (int j = 0; j < d->field_count(); ++j) {
        if (j != i) to->GetReflection()->ClearField(to, d->field(j));
      }
      SCOPED_TRACE(f->full_name());
      ExpectSameAsProtobufs(spec);
      EXPECT_TRUE(Parse(MessageToJson(spec))[holder->name()].contains(f->name()));
    }
  }
  EXPECT_GE(optional_fields, 9);  // lr, seed, min_lr_ratio, ... (job_spec.proto)
}

}  // namespace
}  // namespace loom
