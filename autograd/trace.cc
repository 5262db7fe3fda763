#include "autograd/trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <limits>
#include <map>

#include "autograd/engine.h"
#include "nlohmann/json.hpp"

namespace tg {
namespace {

std::atomic<int> next_thread_number{0};
thread_local int thread_number = -1;
thread_local std::string thread_role;  // TraceThreadRole's
thread_local int trace_rank = -1;      // SetTraceRank's

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
         k == TraceKind::kRecomputeBegin || k == TraceKind::kCallbackRun;
}
bool IsEnd(TraceKind k) {
  return k == TraceKind::kTaskEnd || k == TraceKind::kNodeEnd || k == TraceKind::kRecomputeEnd ||
         k == TraceKind::kCallbackEnd;
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
    case TraceKind::kCallbackEnd: return "callback_end";
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
    // The thread's name as of its latest event (a small vector: traces have a few threads).
    auto it = std::find_if(s->threads_.begin(), s->threads_.end(),
                           [&](const auto& t) { return t.first == record.thread; });
    if (it == s->threads_.end()) it = s->threads_.insert(it, {record.thread, {}});
    TraceScope::ThreadInfo& info = it->second;
    if (!thread_role.empty() && info.role != thread_role) info.role = thread_role;
    if (trace_rank >= 0) info.rank = trace_rank;
    info.ran_task |= record.kind == TraceKind::kTaskBegin;
    s->events_.push_back(record);
  }
}

void Task(TraceKind kind, std::string_view name, int64_t task, int64_t parent, int depth,
          std::string error) {
  TraceRecord r{kind, std::string(name)};
  r.task = task;
  r.parent_task = parent;
  r.depth = depth;
  r.error = std::move(error);
  Record(std::move(r));
}

void Node(TraceKind kind, std::string name, uint64_t sequence_nr, std::string error) {
  TraceRecord r{kind, std::move(name)};
  r.sequence_nr = sequence_nr;
  r.error = std::move(error);
  Record(std::move(r));
}

void Hook(const char* hook_kind, std::string node, uint64_t handle) {
  TraceRecord r{TraceKind::kHook, hook_kind};
  r.node = std::move(node);
  r.handle = handle;
  Record(std::move(r));
}

void Callback(TraceKind kind, std::string_view name, int64_t task, std::string error) {
  TraceRecord r{kind, std::string(name)};
  r.task = task;
  r.error = std::move(error);
  Record(std::move(r));
}

void Recompute(TraceKind kind, const char* mode, std::string error) {
  TraceRecord r{kind, mode};
  r.error = std::move(error);
  Record(std::move(r));
}

void HandOff(int64_t task) {
  TraceRecord r{TraceKind::kHandOff, "thread"};
  r.task = task;
  Record(std::move(r));
}

std::string CurrentErrorMessage() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace trace_internal

TraceThreadRole::TraceThreadRole(std::string role) : previous_(std::move(thread_role)) {
  thread_role = std::move(role);
}
TraceThreadRole::~TraceThreadRole() { thread_role = std::move(previous_); }

void SetTraceRank(int rank) { trace_rank = rank; }
int TraceRank() { return trace_rank; }

std::vector<std::pair<int, std::string>> TraceScope::thread_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int, std::string>> out;
  for (const auto& [thread, info] : threads_) {
    std::string role = !info.role.empty() ? info.role
                       : info.ran_task    ? std::string("backward")
                                          : absl::StrCat("thread ", thread);
    out.emplace_back(thread, info.rank >= 0 ? absl::StrCat("rank ", info.rank, " / ", role) : role);
  }
  std::sort(out.begin(), out.end());
  return out;
}

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
  for (const auto& [thread, name] : thread_names()) {
    events.push_back(json{{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", 1},
                          {"tid", thread},
                          {"args", json{{"name", name}}}});
  }
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
    if (!e.error.empty()) args["error"] = e.error;
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
  for (const auto& [thread, name] : thread_names()) {
    absl::StrAppend(&out, "# [t", thread, "] ", name, "\n");
  }
  std::map<int, int> indent;  // per thread
  for (const TraceRecord& e : this->events()) {
    int& level = indent[e.thread];
    if (IsEnd(e.kind) && level > 0) --level;
    absl::StrAppend(&out, "[t", e.thread, "] ");
    const std::string ts = std::to_string((e.ts_ns - start_ns_) / 1000);
    absl::StrAppend(&out, std::string(ts.size() < 8 ? 8 - ts.size() : 0, ' '), ts, "us  ",
                    std::string(2 * std::min(level, kMaxTextIndent), ' '));
    // Past the cap the indent stops growing and the level is printed instead: a reentrant
    // chain 47 tasks deep nests ~95 levels, 190 columns of blanks otherwise.
    if (level > kMaxTextIndent) absl::StrAppend(&out, "[level ", level, "] ");
    absl::StrAppend(&out, TraceKindName(e.kind), " ", e.name);
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
    if (!e.error.empty()) absl::StrAppend(&out, " error=\"", e.error, "\"");
    out += '\n';
    if (IsBegin(e.kind)) ++level;
  }
  return out;
}

}  // namespace tg
