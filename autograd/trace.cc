#include "autograd/trace.h"

#include <atomic>
#include <chrono>
#include <limits>
#include <map>

#include "autograd/engine.h"
#include "nlohmann/json.hpp"

namespace tg {
namespace {

std::atomic<int> next_thread_number{0};
thread_local int thread_number = -1;

int ThreadNumber() {
  if (thread_number < 0) thread_number = next_thread_number.fetch_add(1);
  return thread_number;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool IsBegin(TraceKind k) {
  return k == TraceKind::kTaskBegin || k == TraceKind::kNodeBegin ||
         k == TraceKind::kRecomputeBegin;
}
bool IsEnd(TraceKind k) {
  return k == TraceKind::kTaskEnd || k == TraceKind::kNodeEnd || k == TraceKind::kRecomputeEnd;
}

}  // namespace

const char* TraceKindName(TraceKind kind) {
  switch (kind) {
    case TraceKind::kTaskBegin: return "task_begin";
    case TraceKind::kTaskEnd: return "task_end";
    case TraceKind::kNodeBegin: return "node_begin";
    case TraceKind::kNodeEnd: return "node_end";
    case TraceKind::kHook: return "hook";
    case TraceKind::kCallbackQueued: return "callback_queued";
    case TraceKind::kCallbackRun: return "callback_run";
    case TraceKind::kRecomputeBegin: return "recompute_begin";
    case TraceKind::kRecomputeEnd: return "recompute_end";
    case TraceKind::kHandOff: return "handoff";
    case TraceKind::kUser: return "user";
  }
  return "?";
}

namespace trace_internal {

void Record(TraceRecord record) {
  record.thread = ThreadNumber();
  record.ts_ns = NowNs();
  if (record.task < 0) record.task = current_graph_task_id();
  if (record.depth < 0) record.depth = current_reentrant_depth();
  for (TraceScope* s = current; s != nullptr; s = s->parent_) {
    std::lock_guard<std::mutex> lock(s->mu_);
    s->events_.push_back(record);
  }
}

void Task(TraceKind kind, std::string_view name, int64_t task, int64_t parent, int depth) {
  TraceRecord r{kind, std::string(name)};
  r.task = task;
  r.parent_task = parent;
  r.depth = depth;
  Record(std::move(r));
}

void Node(TraceKind kind, std::string name, uint64_t sequence_nr) {
  TraceRecord r{kind, std::move(name)};
  r.sequence_nr = sequence_nr;
  Record(std::move(r));
}

void Hook(const char* hook_kind, std::string node, uint64_t handle) {
  TraceRecord r{TraceKind::kHook, hook_kind};
  r.node = std::move(node);
  r.handle = handle;
  Record(std::move(r));
}

void Callback(TraceKind kind, int64_t task) {
  TraceRecord r{kind, "callback"};
  r.task = task;
  Record(std::move(r));
}

void Recompute(TraceKind kind, const char* mode) { Record(TraceRecord{kind, mode}); }

void HandOff(int64_t task) {
  TraceRecord r{TraceKind::kHandOff, "thread"};
  r.task = task;
  Record(std::move(r));
}

}  // namespace trace_internal

TraceScope::TraceScope() : parent_(trace_internal::current), start_ns_(NowNs()) {
  trace_internal::current = this;
}

TraceScope::~TraceScope() { trace_internal::current = parent_; }

TraceScope::ThreadGuard::ThreadGuard(TraceScope* scope) : previous_(trace_internal::current) {
  trace_internal::current = scope;
}

TraceScope::ThreadGuard::~ThreadGuard() { trace_internal::current = previous_; }

std::vector<TraceRecord> TraceScope::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::string TraceScope::ToChromeJson() const {
  using nlohmann::json;
  json events = json::array();
  for (const TraceRecord& e : this->events()) {
    json j;
    j["name"] = e.kind == TraceKind::kHook   ? e.name + " @ " + e.node
                : e.kind == TraceKind::kUser ? e.name + ": " + e.detail
                                             : e.name;
    j["cat"] = TraceKindName(e.kind);
    j["ph"] = IsBegin(e.kind) ? "B" : IsEnd(e.kind) ? "E" : "i";
    if (j["ph"] == "i") j["s"] = "t";  // an instant on its thread's track
    j["pid"] = 1;
    j["tid"] = e.thread;
    j["ts"] = static_cast<double>(e.ts_ns - start_ns_) / 1000.0;
    json args;
    args["kind"] = TraceKindName(e.kind);
    args["task"] = e.task;
    args["depth"] = e.depth;
    if (e.kind == TraceKind::kTaskBegin || e.kind == TraceKind::kTaskEnd)
      args["parent_task"] = e.parent_task;
    if (e.kind == TraceKind::kNodeBegin || e.kind == TraceKind::kNodeEnd)
      args["sequence_nr"] = e.sequence_nr;
    if (e.kind == TraceKind::kHook) {
      args["node"] = e.node;
      args["handle"] = e.handle;
    }
    if (!e.detail.empty()) args["detail"] = e.detail;
    j["args"] = std::move(args);
    events.push_back(std::move(j));
  }
  json doc;
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ns";
  return doc.dump(1);
}

std::string TraceScope::ToText() const {
  std::string out;
  std::map<int, int> indent;  // per thread
  for (const TraceRecord& e : this->events()) {
    int& level = indent[e.thread];
    if (IsEnd(e.kind) && level > 0) --level;
    absl::StrAppend(&out, "[t", e.thread, "] ");
    const std::string ts = std::to_string((e.ts_ns - start_ns_) / 1000);
    absl::StrAppend(&out, std::string(ts.size() < 8 ? 8 - ts.size() : 0, ' '), ts, "us  ",
                    std::string(2 * level, ' '), TraceKindName(e.kind), " ", e.name);
    switch (e.kind) {
      case TraceKind::kTaskBegin:
      case TraceKind::kTaskEnd:
        absl::StrAppend(&out, " task=", e.task, " parent=", e.parent_task, " depth=", e.depth);
        break;
      case TraceKind::kNodeBegin:
      case TraceKind::kNodeEnd:
        // AccumulateGrad's sequence number is the engine's "runs first" marker (UINT64_MAX).
        absl::StrAppend(&out, " seq=",
                        e.sequence_nr == std::numeric_limits<uint64_t>::max()
                            ? std::string("first")
                            : absl::StrCat(e.sequence_nr),
                        " task=", e.task);
        break;
      case TraceKind::kHook:
        absl::StrAppend(&out, " node=", e.node, " handle=", e.handle, " task=", e.task);
        break;
      case TraceKind::kUser:
        absl::StrAppend(&out, ": ", e.detail, e.task >= 0 ? absl::StrCat(" task=", e.task) : "");
        break;
      default:
        absl::StrAppend(&out, " task=", e.task);
    }
    out += '\n';
    if (IsBegin(e.kind)) ++level;
  }
  return out;
}

}  // namespace tg
