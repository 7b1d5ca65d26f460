// A fuzzer over every request type of both services: random
// bytes and mutated messages (random fields filled through reflection, then
// bytes flipped, cut or inserted), sent to every method of mutwo.v1.Planner
// and mutwo.v1.WorkerHub of an in-process mutwo-server on loopback, from
// several threads. Ids of a real model, job, task and worker are planted in
// string fields so that requests reach past the id checks.
//
// Bars: every reply a defined status (never UNKNOWN, never INTERNAL with an
// empty message), the server still serving afterwards, `PRAGMA
// integrity_check` ok, and no stored profile that the planner would refuse.
//
// MUTWO_FUZZ_REQUESTS sets the number of requests (default 1,500: the short
// form ctest runs; scripts/fault-suite.sh runs 100,000) and MUTWO_FUZZ_SEED
// the seed; the counts by status code are printed as one JSON line.
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "planner/proto_convert.h"
#include "server/server.h"
#include "storage/sqlite.h"
#include "tests/testing/grpc_calls.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/synthetic_profile.h"

namespace mutwo {
namespace {

namespace pb = google::protobuf;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? std::atoll(v) : fallback;
}

// Random values for every field of `m`, recursing into messages to `depth`;
// `ids` are planted in string fields half of the time.
void Fill(pb::Message* m, std::mt19937_64& rng,
          const std::vector<std::string>& ids, int depth) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  std::uniform_int_distribution<int> coin(0, 3);
  auto random_string = [&] {
    if (!ids.empty() && coin(rng) < 2) return ids[rng() % ids.size()];
    std::string s(rng() % 24, '\0');
    // Mostly printable (invalid UTF-8 stops at the parser), some raw.
    const bool raw = rng() % 8 == 0;
    for (char& c : s) {
      c = raw ? static_cast<char>(rng()) : static_cast<char>(' ' + rng() % 95);
    }
    return s;
  };
  auto random_int = [&]() -> int64_t {
    switch (rng() % 5) {
      case 0:
        return 0;
      case 1:
        return static_cast<int64_t>(rng() % 64);
      case 2:
        return -static_cast<int64_t>(rng() % 64);
      case 3:
        return INT64_MAX - static_cast<int64_t>(rng() % 2);
      default:
        return static_cast<int64_t>(rng());
    }
  };
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (coin(rng) == 0) continue;
    const int count = f->is_repeated() ? static_cast<int>(rng() % 4) : 1;
    for (int k = 0; k < count; ++k) {
      switch (f->cpp_type()) {
        case pb::FieldDescriptor::CPPTYPE_MESSAGE:
          if (depth > 0) {
            pb::Message* sub = f->is_repeated() ? r->AddMessage(m, f)
                                                : r->MutableMessage(m, f);
            Fill(sub, rng, ids, depth - 1);
          }
          break;
        case pb::FieldDescriptor::CPPTYPE_STRING:
          f->is_repeated() ? r->AddString(m, f, random_string())
                           : r->SetString(m, f, random_string());
          break;
        case pb::FieldDescriptor::CPPTYPE_INT64:
          f->is_repeated() ? r->AddInt64(m, f, random_int())
                           : r->SetInt64(m, f, random_int());
          break;
        case pb::FieldDescriptor::CPPTYPE_INT32:
          f->is_repeated()
              ? r->AddInt32(m, f, static_cast<int32_t>(random_int()))
              : r->SetInt32(m, f, static_cast<int32_t>(random_int()));
          break;
        case pb::FieldDescriptor::CPPTYPE_UINT64:
        case pb::FieldDescriptor::CPPTYPE_UINT32:
          break;  // none in mutwo's protos
        case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
          const double values[] = {0, 0.5, 1, -1, 1e300, -0.0, NAN, INFINITY};
          const double v = values[rng() % 8];
          f->is_repeated() ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
          break;
        }
        case pb::FieldDescriptor::CPPTYPE_FLOAT:
          f->is_repeated() ? r->AddFloat(m, f, 0.5f) : r->SetFloat(m, f, 0.5f);
          break;
        case pb::FieldDescriptor::CPPTYPE_BOOL:
          f->is_repeated() ? r->AddBool(m, f, rng() & 1)
                           : r->SetBool(m, f, rng() & 1);
          break;
        case pb::FieldDescriptor::CPPTYPE_ENUM: {
          const int v = static_cast<int>(rng() % 12) - 2;
          f->is_repeated() ? r->AddEnumValue(m, f, v)
                           : r->SetEnumValue(m, f, v);
          break;
        }
      }
    }
  }
}

std::string Mutate(std::string bytes, std::mt19937_64& rng) {
  const int edits = static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !bytes.empty(); ++e) {
    const size_t at = rng() % bytes.size();
    switch (rng() % 3) {
      case 0:
        bytes[at] = static_cast<char>(rng());
        break;
      case 1:
        bytes.resize(at);
        break;
      default:
        bytes.insert(at, 1 + rng() % 8, static_cast<char>(rng()));
        break;
    }
  }
  return bytes;
}

class FuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("fuzz_", ::getpid());
    std::filesystem::remove_all(dir_);
    MutwoServer::Options options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    options.data_dir = (dir_ / "data").string();
    options.core.lease_timeout_ms = 2000;
    options.core.max_lease_wait_ms = 200;
    options.core.max_model_bytes = 1 << 20;
    options.plan = PlannerPlanFn(5);
    options.max_batch = PlannerMaxBatchFn();
    auto server = MutwoServer::Create(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_TRUE(server_->Start().ok());
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    Seed();
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(5));
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A model, a job, a worker and a leased task: ids to plant.
  void Seed() {
    auto planner = v1::Planner::NewStub(channel_);
    auto hub = v1::WorkerHub::NewStub(channel_);
    const std::string model =
        testing::UncheckedModelArchive("fuzz model bytes");
    const std::string sha = Sha256Hex(model);
    {
      const grpc::Status uploaded =
          testing::UploadModel(*planner, model, /*out=*/nullptr, "fuzz");
      ASSERT_TRUE(uploaded.ok()) << uploaded.error_message();
    }
    v1::SubmitJobRequest submit;
    submit.mutable_spec()->set_model_sha256(sha);
    *submit.mutable_spec()->add_inputs() = *ParseTensorSpec("x:float32[B,16]");
    submit.mutable_spec()->add_batch_sizes(2);
    submit.mutable_spec()->add_budgets()->set_fraction_of_baseline(0.5);
    v1::SubmitJobResponse submitted;
    const grpc::Status s = testing::SubmitJob(*planner, submit, &submitted);
    ASSERT_TRUE(s.ok()) << s.error_message();
    grpc::ClientContext reg_ctx;
    v1::RegisterWorkerRequest reg;
    reg.mutable_worker()->mutable_device()->set_kind("cpu");
    v1::RegisterWorkerResponse registered;
    ASSERT_TRUE(hub->RegisterWorker(&reg_ctx, reg, &registered).ok());
    grpc::ClientContext lease_ctx;
    v1::LeaseTaskRequest lease;
    lease.set_worker_id(registered.worker_id());
    v1::LeaseTaskResponse leased;
    ASSERT_TRUE(hub->LeaseTask(&lease_ctx, lease, &leased).ok());
    ids_ = {sha,
            submitted.job().job_id(),
            registered.worker_id(),
            leased.task().task_id(),
            "cpu",
            "60%"};
    worker_id_ = registered.worker_id();
    task_ = leased.task();
  }

  std::filesystem::path dir_;
  std::unique_ptr<MutwoServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<std::string> ids_;
  std::string worker_id_;
  v1::Task task_;  // leased by worker_id_
};

TEST_F(FuzzTest, EveryRequestTypeGetsADefinedStatus) {
  const int64_t requests = EnvInt("MUTWO_FUZZ_REQUESTS", 1500);
  const uint64_t seed = static_cast<uint64_t>(EnvInt("MUTWO_FUZZ_SEED", 15));
  std::vector<const pb::MethodDescriptor*> methods;
  for (const char* name : {"mutwo.v1.Planner", "mutwo.v1.WorkerHub"}) {
    const pb::ServiceDescriptor* service =
        pb::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      methods.push_back(service->method(i));
    }
  }
  ASSERT_GE(methods.size(), 16u);

  absl::Mutex mu;
  std::map<std::string, int64_t> codes;
  std::vector<std::string> undefined;
  std::atomic<int64_t> next{0};
  auto run = [&](int thread) {
    std::mt19937_64 rng(seed * 1000 + thread);
    pb::MessageFactory* factory = pb::MessageFactory::generated_factory();
    while (true) {
      const int64_t i = next++;
      if (i >= requests) return;
      const pb::MethodDescriptor* method = methods[rng() % methods.size()];
      std::string bytes;
      if (rng() % 3 == 0) {
        bytes.resize(rng() % 256);
        for (char& c : bytes) c = static_cast<char>(rng());
      } else {
        std::unique_ptr<pb::Message> m(
            factory->GetPrototype(method->input_type())->New());
        Fill(m.get(), rng, ids_, 3);
        bytes = m->SerializeAsString();
        if (rng() % 2 == 0) bytes = Mutate(std::move(bytes), rng);
      }
      const std::string path = absl::StrCat("/", method->service()->full_name(),
                                            "/", method->name());
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(300));
      // Every method as a bidi stream of raw bytes: the wire is the same.
      std::unique_ptr<
          grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
          call(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer,
                                                         grpc::ByteBuffer>::
                   Create(channel_.get(),
                          grpc::internal::RpcMethod(
                              path.c_str(),
                              grpc::internal::RpcMethod::BIDI_STREAMING),
                          &ctx));
      grpc::Slice slice(bytes);
      grpc::ByteBuffer request(&slice, 1);
      call->Write(request);
      call->WritesDone();
      grpc::ByteBuffer response;
      while (call->Read(&response)) {
      }
      const grpc::Status status = call->Finish();
      const bool bad =
          status.error_code() == grpc::StatusCode::UNKNOWN ||
          (status.error_code() == grpc::StatusCode::INTERNAL &&
           status.error_message().empty()) ||
          (!status.ok() && status.error_message().empty() &&
           status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
           status.error_code() != grpc::StatusCode::CANCELLED);
      absl::MutexLock lock(&mu);
      ++codes[absl::StrCat(status.error_code())];
      if (bad && undefined.size() < 20) {
        undefined.push_back(absl::StrCat(path, ": code ", status.error_code(),
                                         " \"", status.error_message(), "\""));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(run, t);
  for (std::thread& t : threads) t.join();

  std::string json = "{";
  for (const auto& [code, n] : codes) {
    absl::StrAppend(&json, json.size() > 1 ? ", " : "", "\"", code, "\": ", n);
  }
  std::cout << "{\"fuzz_requests\": " << requests << ", \"codes\": " << json
            << "}, \"undefined\": " << undefined.size() << "}\n";
  for (const std::string& u : undefined) ADD_FAILURE() << u;

  // Profiles with one field spoiled, reported by the worker that holds the
  // lease (so only validation stands between them and the store).
  auto hub = v1::WorkerHub::NewStub(channel_);
  {
    // A fresh worker and lease: the fuzzer may have cancelled the seeded
    // job or deregistered the seeded worker.
    grpc::ClientContext reg_ctx;
    v1::RegisterWorkerRequest reg;
    reg.mutable_worker()->mutable_device()->set_kind("cpu");
    v1::RegisterWorkerResponse registered;
    ASSERT_TRUE(hub->RegisterWorker(&reg_ctx, reg, &registered).ok());
    worker_id_ = registered.worker_id();
    auto planner_stub = v1::Planner::NewStub(channel_);
    for (int attempt = 0; attempt < 50; ++attempt) {
      v1::SubmitJobRequest submit;
      submit.mutable_spec()->set_model_sha256(ids_[0]);
      *submit.mutable_spec()->add_inputs() =
          *ParseTensorSpec("x:float32[B,16]");
      submit.mutable_spec()->add_batch_sizes(2);
      ASSERT_TRUE(testing::SubmitJob(*planner_stub, submit).ok());
      grpc::ClientContext lease_ctx;
      v1::LeaseTaskRequest lease;
      lease.set_worker_id(worker_id_);
      v1::LeaseTaskResponse leased;
      ASSERT_TRUE(hub->LeaseTask(&lease_ctx, lease, &leased).ok());
      if (leased.task().kind() == v1::Task::PROFILE) {
        task_ = leased.task();
        break;
      }
    }
    ASSERT_FALSE(task_.task_id().empty());
  }
  std::mt19937_64 rng(seed);
  int64_t refused = 0, accepted = 0;
  const int64_t profile_reports = std::max<int64_t>(200, requests / 100);
  for (int64_t i = 0; i < profile_reports; ++i) {
    v1::ReportProfileRequest r;
    r.set_worker_id(worker_id_);
    r.set_task_id(task_.task_id());
    r.set_fence_token(task_.fence_token());
    v1::Profile* p = r.mutable_profile();
    *p = testing::ChainProfile(task_.batch_size());
    // One random scalar of a random node, activation or step.
    pb::Message* target = p;
    switch (rng() % 4) {
      case 0:
        target = p->mutable_nodes(rng() % p->nodes_size());
        break;
      case 1:
        target = p->mutable_activations(rng() % p->activations_size());
        break;
      case 2:
        target = p->mutable_backward_steps(rng() % p->backward_steps_size());
        break;
      default:
        target = p->mutable_fixed();
        break;
    }
    const pb::Descriptor* d = target->GetDescriptor();
    const pb::FieldDescriptor* f = d->field(rng() % d->field_count());
    const int64_t values[] = {-1, 0, 1, 1000000, INT64_MIN, INT64_MAX};
    const int64_t v = values[rng() % 6];
    const pb::Reflection* refl = target->GetReflection();
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT64:
        f->is_repeated() ? refl->AddInt64(target, f, v)
                         : refl->SetInt64(target, f, v);
        break;
      case pb::FieldDescriptor::CPPTYPE_INT32:
        f->is_repeated() ? refl->AddInt32(target, f, static_cast<int32_t>(v))
                         : refl->SetInt32(target, f, static_cast<int32_t>(v));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        if (!f->is_repeated()) refl->SetDouble(target, f, -1.0 * (rng() % 3));
        break;
      default:
        break;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::ReportResponse response;
    const grpc::Status s = hub->ReportProfile(&ctx, r, &response);
    if (s.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << s.error_message();
      EXPECT_FALSE(s.error_message().empty());
      ++refused;
    }
  }
  std::cout << "{\"spoiled_profile_reports\": " << profile_reports
            << ", \"refused\": " << refused << ", \"accepted\": " << accepted
            << "}\n";

  // Still serving: a well-formed call answers.
  auto planner = v1::Planner::NewStub(channel_);
  grpc::ClientContext ctx;
  v1::ListJobsRequest list;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(planner->ListJobs(&ctx, list, &jobs).ok());
  EXPECT_GE(jobs.jobs_size(), 1);
  server_->Shutdown(absl::Seconds(5));
  server_.reset();

  auto db = storage::Db::Open((dir_ / "data" / "mutwo.db").string(), 5000);
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(*(*db)->QueryText("PRAGMA integrity_check"), "ok");
  auto stmt = (*db)->Prepare("SELECT profile FROM profiles");
  ASSERT_TRUE(stmt.ok());
  int64_t profiles = 0;
  while ((*stmt)->Step().value_or(false)) {
    v1::Profile p;
    ASSERT_TRUE(p.ParseFromString((*stmt)->ColumnBlob(0)));
    EXPECT_TRUE(planner::ValidateProfile(p).ok())
        << "a malformed profile was stored";
    ++profiles;
  }
  std::cout << "{\"profiles_stored\": " << profiles << "}\n";
}

// SIGTERM with a WatchJob stream open (the drain took its whole
// 10 s timeout at ~100% CPU): the stream ends with UNAVAILABLE as soon as
// the server shuts down, so the drain is short.
TEST_F(FuzzTest, ShutdownWithAWatchOpenDrainsAtOnce) {
  auto planner = v1::Planner::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::WatchJobRequest watch;
  watch.set_job_id(ids_[1]);
  auto reader = planner->WatchJob(&ctx, watch);
  v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event));  // the watch is open
  std::thread watcher([&] {
    while (reader->Read(&event)) {
    }
  });
  const auto start = std::chrono::steady_clock::now();
  server_->Shutdown(absl::Seconds(10));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  watcher.join();
  const grpc::Status status = reader->Finish();
  server_.reset();
  std::cout << "{\"drain_s_with_watch_open\": " << seconds << "}\n";
  EXPECT_LT(seconds, 2.0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
}

}  // namespace
}  // namespace mutwo
