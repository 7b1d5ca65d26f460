// Test helpers: the gRPC calls the server tests make of a running
// mutwo-server (in-process or a real process), each with a 10 s deadline.
//
// Ownership: nothing kept; the caller's stub and channel.
// Thread safety: as the stub (any thread).
// Errors: each returns the call's status for the test to check.
#ifndef MUTWO_TESTS_TESTING_GRPC_CALLS_H_
#define MUTWO_TESTS_TESTING_GRPC_CALLS_H_

#include <chrono>
#include <string>

#include "common/parse.h"
#include "common/sha256.h"
#include "grpcpp/grpcpp.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"

namespace mutwo::testing {

// A deadline `ms` from now.
inline std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

// Uploads `bytes` in one chunk, as a model named `name`.
inline grpc::Status UploadModel(v1::Planner::Stub& planner,
                                const std::string& bytes,
                                v1::UploadModelResponse* out = nullptr,
                                const std::string& name = "m") {
  grpc::ClientContext context;
  context.set_deadline(In(10000));
  v1::UploadModelResponse response;
  auto writer = planner.UploadModel(&context, &response);
  v1::UploadModelRequest header;
  header.mutable_header()->set_sha256(Sha256Hex(bytes));
  header.mutable_header()->set_size_bytes(bytes.size());
  header.mutable_header()->set_name(name);
  writer->Write(header);
  v1::UploadModelRequest chunk;
  chunk.set_chunk(bytes);
  writer->Write(chunk);
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (out != nullptr) *out = response;
  return status;
}

// A job for the model `model_bytes` (named "chain"): input x:float32[B,16],
// batch size 8, budget 60%, on `device_kind` (empty: any).
inline v1::SubmitJobRequest ChainJobRequest(const std::string& model_bytes,
                                            const std::string& device_kind) {
  v1::SubmitJobRequest r;
  auto* spec = r.mutable_spec();
  spec->set_model_sha256(Sha256Hex(model_bytes));
  spec->set_model_name("chain");
  *spec->add_inputs() = *ParseTensorSpec("x:float32[B,16]");
  spec->add_batch_sizes(8);
  *spec->add_budgets() = *ParseBudget("60%");
  spec->set_device_kind(device_kind);
  return r;
}

// Submits `request` with a `deadline_ms` deadline; `*response` gets the
// answer (the job, whether it was deduplicated).
inline grpc::Status SubmitJob(v1::Planner::Stub& planner,
                              const v1::SubmitJobRequest& request,
                              v1::SubmitJobResponse* response,
                              int deadline_ms = 10000) {
  grpc::ClientContext context;
  context.set_deadline(In(deadline_ms));
  return planner.SubmitJob(&context, request, response);
}

// Submits `request`; `*job_id` (when not null) gets the job's id.
inline grpc::Status SubmitJob(v1::Planner::Stub& planner,
                              const v1::SubmitJobRequest& request,
                              std::string* job_id = nullptr) {
  v1::SubmitJobResponse response;
  grpc::Status s = SubmitJob(planner, request, &response);
  if (job_id != nullptr) *job_id = response.job().job_id();
  return s;
}

// Registers a CPU worker (worker id `worker_id`, empty: the server picks
// one) and returns the status; `*out` gets the id.
inline grpc::Status RegisterCpuWorker(v1::WorkerHub::Stub& hub,
                                      const std::string& worker_id = "",
                                      std::string* out = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(In(10000));
  v1::RegisterWorkerRequest request;
  request.mutable_worker()->set_worker_id(worker_id);
  request.mutable_worker()->mutable_device()->set_kind("cpu");
  request.mutable_worker()->mutable_device()->set_name("cpu");
  v1::RegisterWorkerResponse response;
  grpc::Status s = hub.RegisterWorker(&context, request, &response);
  if (out != nullptr) *out = response.worker_id();
  return s;
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_GRPC_CALLS_H_
