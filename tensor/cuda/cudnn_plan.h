// A thin C++ layer over cuDNN 9's backend (graph) API, shared by the convolutions
// (tensor/cuda/conv.cc) and the fused attention (tensor/cuda/attention.cc). Internal to
// //tensor/cuda:cudnn.
//
// The backend API describes work as an operation graph of descriptors: tensor descriptors
// (unique id, dtype, dims, strides; virtual ones live only inside the fused kernel), operation
// descriptors (convolution, matmul, pointwise, reduction, reshape) wired through those tensors,
// and the graph itself. cuDNN's heuristics propose engine configurations for a finalised graph;
// the first that finalises into an execution plan runs it with a variant pack (unique id ->
// device pointer, plus a workspace). Building a plan costs milliseconds (runtime-compiled
// engines: seconds), so callers cache plans per problem; executing one costs a launch.
//
//   dnn::Graph g;
//   const dnn::Descriptor& x = g.RawTensor({kX, CUDNN_DATA_FLOAT, {n, c, h, w}, strides});
//   ...
//   g.AddOp(std::move(conv_op));
//   std::string why;
//   std::unique_ptr<dnn::Plan> plan = dnn::BuildPlan(handle, std::move(g), {}, &why);
//   plan->Execute(handle, {kX, kW, kY}, {x_ptr, w_ptr, y_ptr}, workspace);
#ifndef TAPEGRAD_TENSOR_CUDA_CUDNN_PLAN_H_
#define TAPEGRAD_TENSOR_CUDA_CUDNN_PLAN_H_

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tg::cuda::dnn {

// Owns one cudnnBackendDescriptor_t. Setters throw tg::Error (TG_CUDNN_CHECK) on failure.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept;
  Descriptor& operator=(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }

  Descriptor& Set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const void* values);
  Descriptor& SetInt64(cudnnBackendAttributeName_t name, int64_t value);
  Descriptor& SetInt64s(cudnnBackendAttributeName_t name, const std::vector<int64_t>& values);
  Descriptor& SetDataType(cudnnBackendAttributeName_t name, cudnnDataType_t value);
  Descriptor& SetBool(cudnnBackendAttributeName_t name, bool value);
  Descriptor& SetFloat(cudnnBackendAttributeName_t name, float value);
  Descriptor& SetDouble(cudnnBackendAttributeName_t name, double value);
  Descriptor& SetDesc(cudnnBackendAttributeName_t name, const Descriptor& value);
  Descriptor& SetHandle(cudnnBackendAttributeName_t name, cudnnHandle_t handle);

  // Finalize() throws tg::Error naming `what` and cuDNN's last error text; TryFinalize()
  // returns the status (engine configurations that do not apply fail here, which is normal).
  void Finalize(const char* what);
  cudnnStatus_t TryFinalize();

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// One tensor of a graph. Non-virtual tensors are bound to memory by uid in the variant pack;
// by-value tensors are scalars passed as host pointers in the variant pack (e.g. a scale).
struct TensorSpec {
  int64_t uid;
  cudnnDataType_t dtype;
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
  bool is_virtual = false;
  bool by_value = false;
  int64_t alignment = 16;  // bytes; must not exceed the real pointer's alignment
};

// The descriptors of one operation graph, kept alive together (a plan is built from them).
class Graph {
 public:
  const Descriptor& RawTensor(const TensorSpec& spec);
  // Keeps a helper descriptor (convolution, matmul, pointwise, reduction settings) alive.
  const Descriptor& Keep(Descriptor d);
  // Adds a finalised operation to the graph, in the order given.
  void AddOp(Descriptor op);

  // Finalises the operation graph on `handle`; false, with the reason in *why, on failure.
  bool Finalize(cudnnHandle_t handle, std::string* why);
  const Descriptor& graph() const { return *graph_; }

 private:
  std::vector<std::unique_ptr<Descriptor>> kept_;
  std::vector<std::unique_ptr<Descriptor>> ops_;
  std::unique_ptr<Descriptor> graph_;
};

// Which engine configurations BuildPlan may choose.
struct PlanOptions {
  // Skip engines whose numerical notes say they compute with tensor cores (for f32 graphs this
  // means TF32) or convert inputs to a narrower type first.
  bool exclude_tensor_core = false;
  bool exclude_down_convert = true;
  // Skip engines that accumulate in reduced precision (f16 sums of f16 data).
  bool exclude_reduced_precision = true;
  // Skip FFT and Winograd engines: their error is bounded by the norms of whole inputs rather
  // than element by element, so results drift further from a direct (im2col) computation.
  bool exclude_transforms = false;
  // Deterministic engines are preferred; non-deterministic ones are taken only when no
  // deterministic one applies.
  int64_t max_workspace_bytes = int64_t{1} << 30;
};

// A finalised execution plan with the graph it was built from.
class Plan {
 public:
  Plan(Graph graph, Descriptor config, Descriptor plan, int64_t workspace_bytes);
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // Enqueues the plan on the handle's stream; uids[i] is bound to pointers[i].
  void Execute(cudnnHandle_t handle, const std::vector<int64_t>& uids,
               const std::vector<void*>& pointers, void* workspace) const;

 private:
  Graph graph_;
  Descriptor config_;
  Descriptor plan_;
  int64_t workspace_bytes_;
};

// Finalises `graph`, asks cuDNN's heuristics (mode A, then the fallback list) for engine
// configurations, and returns a plan of the first that finalises and passes `options`. Returns
// nullptr, with the reason in *why, when none does.
std::unique_ptr<Plan> BuildPlan(cudnnHandle_t handle, Graph graph, const PlanOptions& options,
                                std::string* why);

// cudnnGetErrorString plus cuDNN's last error message (which says which check failed).
std::string CudnnStatusText(cudnnStatus_t status);

}  // namespace tg::cuda::dnn

#endif  // TAPEGRAD_TENSOR_CUDA_CUDNN_PLAN_H_
