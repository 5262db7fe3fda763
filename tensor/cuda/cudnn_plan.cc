// The backend-descriptor layer of tensor/cuda/cudnn_plan.h.
#include "tensor/cuda/cudnn_plan.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/runtime.h"

namespace tg::cuda::dnn {

std::string CudnnStatusText(cudnnStatus_t status) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  return absl::StrCat(cudnnGetErrorString(status), last[0] != '\0' ? " (" : "", last,
                      last[0] != '\0' ? ")" : "");
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  TG_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_));
}

Descriptor::~Descriptor() {
  if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
}

Descriptor::Descriptor(Descriptor&& other) noexcept : desc_(std::exchange(other.desc_, nullptr)) {}

Descriptor& Descriptor::operator=(Descriptor&& other) noexcept {
  if (this != &other) {
    if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
    desc_ = std::exchange(other.desc_, nullptr);
  }
  return *this;
}

Descriptor& Descriptor::Set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            int64_t count, const void* values) {
  TG_CUDNN_CHECK(cudnnBackendSetAttribute(desc_, name, type, count, values));
  return *this;
}

Descriptor& Descriptor::SetInt64(cudnnBackendAttributeName_t name, int64_t value) {
  return Set(name, CUDNN_TYPE_INT64, 1, &value);
}

Descriptor& Descriptor::SetInt64s(cudnnBackendAttributeName_t name,
                                  const std::vector<int64_t>& values) {
  return Set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(values.size()), values.data());
}

Descriptor& Descriptor::SetDataType(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
  return Set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
}

Descriptor& Descriptor::SetBool(cudnnBackendAttributeName_t name, bool value) {
  return Set(name, CUDNN_TYPE_BOOLEAN, 1, &value);
}

Descriptor& Descriptor::SetFloat(cudnnBackendAttributeName_t name, float value) {
  return Set(name, CUDNN_TYPE_FLOAT, 1, &value);
}

Descriptor& Descriptor::SetDouble(cudnnBackendAttributeName_t name, double value) {
  return Set(name, CUDNN_TYPE_DOUBLE, 1, &value);
}

Descriptor& Descriptor::SetDesc(cudnnBackendAttributeName_t name, const Descriptor& value) {
  cudnnBackendDescriptor_t raw = value.get();
  return Set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

Descriptor& Descriptor::SetHandle(cudnnBackendAttributeName_t name, cudnnHandle_t handle) {
  return Set(name, CUDNN_TYPE_HANDLE, 1, &handle);
}

void Descriptor::Finalize(const char* what) {
  const cudnnStatus_t status = cudnnBackendFinalize(desc_);
  if (status != CUDNN_STATUS_SUCCESS) {
    throw Error(absl::StrCat("cuDNN: finalizing ", what, " failed: ", CudnnStatusText(status)));
  }
}

cudnnStatus_t Descriptor::TryFinalize() { return cudnnBackendFinalize(desc_); }

const Descriptor& Graph::RawTensor(const TensorSpec& s) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.SetDataType(CUDNN_ATTR_TENSOR_DATA_TYPE, s.dtype)
      .SetInt64s(CUDNN_ATTR_TENSOR_DIMENSIONS, s.dims)
      .SetInt64s(CUDNN_ATTR_TENSOR_STRIDES, s.strides)
      .SetInt64(CUDNN_ATTR_TENSOR_UNIQUE_ID, s.uid)
      .SetInt64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, s.alignment);
  if (s.is_virtual) t.SetBool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, true);
  if (s.by_value) t.SetBool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
  t.Finalize(absl::StrCat("tensor ", s.uid).c_str());
  return Keep(std::move(t));
}

const Descriptor& Graph::Keep(Descriptor d) {
  kept_.push_back(std::make_unique<Descriptor>(std::move(d)));
  return *kept_.back();
}

void Graph::AddOp(Descriptor op) { ops_.push_back(std::make_unique<Descriptor>(std::move(op))); }

bool Graph::Finalize(cudnnHandle_t handle, std::string* why) {
  graph_ = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const auto& op : ops_) ops.push_back(op->get());
  graph_->Set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
              static_cast<int64_t>(ops.size()), ops.data());
  graph_->SetHandle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle);
  const cudnnStatus_t status = graph_->TryFinalize();
  if (status != CUDNN_STATUS_SUCCESS) {
    *why = absl::StrCat("the operation graph was rejected: ", CudnnStatusText(status));
    return false;
  }
  return true;
}

Plan::Plan(Graph graph, Descriptor config, Descriptor plan, int64_t workspace_bytes)
    : graph_(std::move(graph)),
      config_(std::move(config)),
      plan_(std::move(plan)),
      workspace_bytes_(workspace_bytes) {}

void Plan::Execute(cudnnHandle_t handle, const std::vector<int64_t>& uids,
                   const std::vector<void*>& pointers, void* workspace) const {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.Set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data());
  pack.Set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(pointers.size()), pointers.data());
  pack.Set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.Finalize("variant pack");
  TG_CUDNN_CHECK(cudnnBackendExecute(handle, plan_.get(), pack.get()));
}

namespace {

// The numerical notes of the engine behind an engine configuration.
std::vector<cudnnBackendNumericalNote_t> NotesOf(const Descriptor& config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t count = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                               &raw) != CUDNN_STATUS_SUCCESS) {
    return {};
  }
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                               CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count,
                               notes.data()) != CUDNN_STATUS_SUCCESS) {
    return {};
  }
  return std::vector<cudnnBackendNumericalNote_t>(notes.begin(), notes.begin() + count);
}

bool Has(const std::vector<cudnnBackendNumericalNote_t>& notes, cudnnBackendNumericalNote_t n) {
  for (auto note : notes) {
    if (note == n) return true;
  }
  return false;
}

// The engine configurations cuDNN's heuristics propose in `mode`, best first (empty when the
// mode has none for this graph).
std::vector<Descriptor> Configs(const Graph& graph, cudnnBackendHeurMode_t mode) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.SetDesc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.graph());
  heur.Set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heur.TryFinalize() != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0) {
    return {};
  }
  // The caller creates the descriptors that receive backend-descriptor attributes.
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS) {
    return {};
  }
  configs.resize(static_cast<size_t>(std::min(got, count)));
  return configs;
}

}  // namespace

std::unique_ptr<Plan> BuildPlan(cudnnHandle_t handle, Graph graph, const PlanOptions& options,
                                std::string* why) {
  if (!graph.Finalize(handle, why)) return nullptr;
  std::vector<Descriptor> configs = Configs(graph, CUDNN_HEUR_MODE_A);
  for (Descriptor& c : Configs(graph, CUDNN_HEUR_MODE_FALLBACK)) configs.push_back(std::move(c));
  if (configs.empty()) {
    *why = "cuDNN's heuristics propose no engine for this graph";
    return nullptr;
  }
  std::string last_failure = "every proposed engine was excluded by the numerical-note filter";
  // First pass: the deterministic engines; second pass: the non-deterministic ones.
  for (int pass = 0; pass < 2; ++pass) {
    for (Descriptor& config : configs) {
      const std::vector<cudnnBackendNumericalNote_t> notes = NotesOf(config);
      if (Has(notes, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) != (pass == 1)) continue;
      if (options.exclude_tensor_core && Has(notes, CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) continue;
      if (options.exclude_down_convert && Has(notes, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) {
        continue;
      }
      if (options.exclude_reduced_precision &&
          Has(notes, CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) {
        continue;
      }
      if (options.exclude_transforms &&
          (Has(notes, CUDNN_NUMERICAL_NOTE_FFT) || Has(notes, CUDNN_NUMERICAL_NOTE_WINOGRAD) ||
           Has(notes, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4) ||
           Has(notes, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6) ||
           Has(notes, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13))) {
        continue;
      }
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.SetHandle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
      plan.SetDesc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      const cudnnStatus_t status = plan.TryFinalize();
      if (status != CUDNN_STATUS_SUCCESS) {
        last_failure = absl::StrCat("the last engine tried failed: ", CudnnStatusText(status));
        continue;
      }
      int64_t workspace = 0, count = 0;
      TG_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, &count, &workspace));
      if (workspace > options.max_workspace_bytes) {
        last_failure =
            absl::StrCat("the last engine tried needs ", workspace, " bytes of workspace (limit ",
                         options.max_workspace_bytes, ")");
        continue;
      }
      return std::make_unique<Plan>(std::move(graph), std::move(config), std::move(plan),
                                    workspace);
    }
  }
  *why = absl::StrCat("no proposed engine could run this graph (", configs.size(), " proposed; ",
                      last_failure, ")");
  return nullptr;
}

}  // namespace tg::cuda::dnn
