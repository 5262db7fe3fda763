// Engine event trace: what the engine did during backward, in order. Off by default and free
// when off (each event site is one thread-local pointer test); switched on for the current
// thread by a TraceScope, which collects every event until it is destroyed.
//
//   tg::TraceScope trace;
//   loss.backward();
//   std::string json = trace.ToChromeJson();   // open in Perfetto / chrome://tracing
//   std::string text = trace.ToText();         // one line per event, indented by nesting
//   for (const tg::TraceRecord& e : trace.events()) ...
//
// Events (TraceKind): graph task begin/end (id, parent id, reentrant depth), node begin/end
// (name, sequence number; the span covers the node's hooks), every hook fired (name = the hook
// kind, node = where it is registered, handle = its handle id), callbacks queued and their run
// (a begin/end span: a DDP finaliser's all-reduce wait shows as its length; task = the task they
// belong to; name = what queued them), checkpoint recompute begin/end, the hand-off of a deep
// reentrant task to a fresh thread, and user events from layers above
// (TraceEvent("ddp", "bucket 3 ...")).
//
// Every begin has its end, also when what runs inside throws: the end is then recorded (in
// order, innermost first) with `error` set to the exception's message, so viewers close the
// right spans and the backward's own span ends.
//
// Threads: a scope records the events of the thread that created it, and of the threads that
// join it (TraceScope::ThreadGuard); the engine's hand-off thread joins its caller's scopes.
// Scopes nest: an event goes to every active scope of the thread (the innermost sees a subset
// of the outer's). Two threads with their own scopes do not see each other's events.
#ifndef TAPEGRAD_AUTOGRAD_TRACE_H_
#define TAPEGRAD_AUTOGRAD_TRACE_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tg {

enum class TraceKind {
  kTaskBegin,  // name: "backward" or "grad"
  kTaskEnd,    // name: as its begin (also when the task threw: then `error` is set)
  kNodeBegin,  // name: the node's name
  kNodeEnd,
  kHook,            // name: tensor_pre_hook, node_pre_hook, node_post_hook,
                    // post_accumulate_grad, retain_grad, multi_grad; node: where it ran
  kCallbackQueued,  // name: "callback", or what queued it ("ddp finalize", "multi_grad
                    // cleanup (internal)"); task: the task it was queued on
  kCallbackRun,     // begins the callback's span; name, task: as queued
  kCallbackEnd,     // ends it
  kRecomputeBegin,  // name: "reentrant" or "non_reentrant" (checkpoint)
  kRecomputeEnd,
  kHandOff,  // a nested task continues on a fresh thread
  kUser,     // name: the category ("ddp", "amp", ...); detail: the message
};
// "task_begin", "node_end", "hook", ... (the kind's name in exports and tests).
const char* TraceKindName(TraceKind kind);

struct TraceRecord {
  TraceRecord() = default;
  TraceRecord(TraceKind k, std::string n) : kind(k), name(std::move(n)) {}
  TraceKind kind = TraceKind::kUser;
  std::string name;
  std::string node;    // hooks: the node they belong to
  std::string detail;  // user events: the message
  std::string error;   // span ends: the message of the exception that ended the span (else "")
  int64_t task = -1;   // the graph task (-1 outside backward)
  int64_t parent_task = -1;
  int depth = -1;            // reentrant depth of the task running where the event happened
  uint64_t sequence_nr = 0;  // nodes
  uint64_t handle = 0;       // hooks: the handle id (0 for retain_grad and multi-grad)
  int thread = 0;            // small per-process thread number, in order of first traced event
  int64_t ts_ns = 0;         // steady clock (exports print it relative to the scope's start)
};

class TraceScope;

namespace trace_internal {
// The innermost active scope of this thread (null: tracing is off here).
inline thread_local TraceScope* current = nullptr;
// Stamps thread, time and (unless set) the current task and reentrant depth, and appends the record
// to every active scope of this thread.
void Record(TraceRecord record);
}  // namespace trace_internal

// Names this thread in trace exports (Chrome's thread_name metadata, ToText's header) while it
// lives: "rank R / ROLE" once a rank is known (SetTraceRank), else ROLE. Without one a thread
// is "backward" when it ran a graph task, else "thread N"; the engine names its hand-off
// threads "backward hand-off (task N)".
class TraceThreadRole {
 public:
  explicit TraceThreadRole(std::string role);
  ~TraceThreadRole();
  TraceThreadRole(const TraceThreadRole&) = delete;
  TraceThreadRole& operator=(const TraceThreadRole&) = delete;

 private:
  std::string previous_;
};
// The distributed rank this thread works for (DDP and ZeRO set it in forward; one thread-local
// store, so it is set whether or not tracing is on); -1 (the default) for none.
void SetTraceRank(int rank);
int TraceRank();

// Whether events on this thread are recorded (one thread-local load).
inline bool TracingEnabled() { return trace_internal::current != nullptr; }

class TraceScope {
 public:
  TraceScope();
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  // A copy of the events so far (safe while other threads record).
  std::vector<TraceRecord> events() const;
  // Chrome trace JSON ("traceEvents": first a thread_name metadata event ("ph":"M") per
  // thread, then B/E spans for tasks, nodes, callbacks and recomputes, "i" instants for the
  // rest; ts in microseconds since the scope began, pid 1, tid = thread number; a span that
  // ended by an exception has args.error).
  std::string ToChromeJson() const;
  // One line per event: "[t0]       12us  <indent>kind name ...", indented two spaces per
  // nesting level of its thread up to kMaxTextIndent levels; deeper lines keep that indent and
  // print their level ("[level 95] ") so a depth-47 reentrant chain stays within a screen.
  std::string ToText() const;
  static constexpr int kMaxTextIndent = 12;
  // Thread number -> the thread's name (see TraceThreadRole), for the threads in events().
  std::vector<std::pair<int, std::string>> thread_names() const;

  // Makes another thread record into `scope` (and the scopes it is nested in) while it lives.
  class ThreadGuard {
   public:
    explicit ThreadGuard(TraceScope* scope);
    ~ThreadGuard();
    ThreadGuard(const ThreadGuard&) = delete;
    ThreadGuard& operator=(const ThreadGuard&) = delete;

   private:
    TraceScope* previous_;
  };

 private:
  friend void trace_internal::Record(TraceRecord record);
  TraceScope* parent_;  // the scope active on this thread when this one began
  int64_t start_ns_;
  mutable std::mutex mu_;
  std::vector<TraceRecord> events_;
  // Per thread number: the last role and rank it recorded with ("" / -1: none), and whether
  // it ran a graph task (the default role, "backward").
  struct ThreadInfo {
    std::string role;
    int rank = -1;
    bool ran_task = false;
  };
  std::vector<std::pair<int, ThreadInfo>> threads_;
};

// A user event from a layer above (DDP buckets, amp steps): free when tracing is off, the
// message is built only when on.
//   tg::TraceEvent("ddp", "bucket ", i, " launched");
template <typename... Args>
void TraceEvent(const char* category, const Args&... message) {
  if (!TracingEnabled()) return;
  TraceRecord r{TraceKind::kUser, category};
  r.detail = absl::StrCat(message...);
  trace_internal::Record(std::move(r));
}

// Engine-side helpers (call only when TracingEnabled()); they fill in the current task.
namespace trace_internal {
// `error`: for an end, the message of the exception that ended the span ("" when none).
void Task(TraceKind kind, std::string_view name, int64_t task, int64_t parent, int depth,
          std::string error = {});
void Node(TraceKind kind, std::string name, uint64_t sequence_nr, std::string error = {});
void Hook(const char* hook_kind, std::string node, uint64_t handle);
void Callback(TraceKind kind, std::string_view name, int64_t task, std::string error = {});
void Recompute(TraceKind kind, const char* mode, std::string error = {});
void HandOff(int64_t task);
// Inside a catch block: the message of the exception being handled (what() of a
// std::exception, else "unknown exception").
std::string CurrentErrorMessage();
}  // namespace trace_internal

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_TRACE_H_
