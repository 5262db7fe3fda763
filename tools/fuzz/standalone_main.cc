// A small stand-in for libFuzzer's main(), so that every fuzz target also builds with gcc and runs
// in the default test suite: it runs each seed input, then deterministic mutations of the seeds
// (bit flips, byte insertions and deletions, interesting values, splices of two seeds) until the
// time budget is spent. On a crash (a signal, a failed invariant, an uncaught exception, a
// sanitizer report) it names the input, prints it (hex, when short), saves it to a file that
// libFuzzer binaries and this driver both replay, and exits non-zero.
//
//   <target> [--seconds=S] [--seed=N] [--max_len=B] PATH...   (files, or directories of files)
//
// With --seconds=0 it only replays the given inputs (a crash file, say). Mutation i of a run is
// the same for a given --seed and seed corpus, whatever the budget, so a failure reproduces by
// rerunning with that seed, or at once from the saved file.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

// What the signal handler reports: set before each input runs (the handler may only read them).
char g_description[1024];
char g_crash_path[4096];
const uint8_t* g_data = nullptr;
size_t g_size = 0;

void WriteString(const char* s) {
  ssize_t ignored = ::write(2, s, std::strlen(s));
  (void)ignored;
}

// Names the input, prints it (hex, when short) and saves it. Async-signal-safe: write() and
// open() only.
void Report(const char* what) {
  WriteString("\n==== fuzz driver: ");
  WriteString(what);
  WriteString(" while running ");
  WriteString(g_description);
  WriteString("\n");
  if (g_size <= 1024) {
    static const char kHex[] = "0123456789abcdef";
    char line[3 * 32 + 2];
    for (size_t i = 0; i < g_size; i += 32) {
      size_t n = 0;
      for (size_t j = i; j < g_size && j < i + 32; ++j) {
        line[n++] = kHex[g_data[j] >> 4];
        line[n++] = kHex[g_data[j] & 15];
        line[n++] = ' ';
      }
      line[n++] = '\n';
      line[n] = '\0';
      WriteString(line);
    }
  }
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ssize_t ignored = ::write(fd, g_data, g_size);
    (void)ignored;
    ::close(fd);
    WriteString("==== the input is saved as ");
    WriteString(g_crash_path);
    WriteString("\n");
  }
}

void OnSignal(int sig) {
  Report(sig == SIGABRT   ? "SIGABRT (an abort, a failed invariant or an uncaught exception)"
         : sig == SIGSEGV ? "SIGSEGV"
         : sig == SIGBUS  ? "SIGBUS"
         : sig == SIGFPE  ? "SIGFPE"
                          : "SIGILL");
  ::raise(sig);  // SA_RESETHAND restored the default action: die with this signal
}

void OnSanitizerDeath() { Report("a sanitizer error"); }

}  // namespace

// Present only in sanitizer builds (--config=fuzz): their reports end through this callback.
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace {

void InstallCrashHandlers() {
  static char alt_stack[1 << 16];  // a stack overflow still reports
  stack_t ss = {};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  sigaltstack(&ss, nullptr);
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESETHAND | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGABRT, &action, nullptr);
  if (__sanitizer_set_death_callback != nullptr) {
    __sanitizer_set_death_callback(OnSanitizerDeath);  // the sanitizer keeps SIGSEGV & co.
    return;
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(sig, &action, nullptr);
}

void RunOne(const Bytes& input, const std::string& description) {
  std::snprintf(g_description, sizeof(g_description), "%s (%zu bytes)", description.c_str(),
                input.size());
  // A copy in a buffer of its exact size, so that a read past the end is caught by ASan.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[input.size()]);
  if (!input.empty()) std::memcpy(copy.get(), input.data(), input.size());
  g_data = copy.get();
  g_size = input.size();
  LLVMFuzzerTestOneInput(copy.get(), input.size());
}

// Interesting bytes: boundaries of signed/unsigned bytes, digits and JSON syntax.
constexpr uint8_t kBytes[] = {0,   1,   0x7f, 0x80, 0xff, '0', '9', '-',
                              '"', '[', ']',  '{',  '}',  ',', ':', ' '};

// 0 to 8, or 2^k or 2^k - 1 for k in {7, 8, 15, 16, 31, 32, 63}: width boundaries.
uint64_t InterestingInt(std::mt19937_64& rng) {
  static constexpr int kBits[] = {7, 8, 15, 16, 31, 32, 63};
  if (rng() % 3 == 0) return rng() % 9;
  const uint64_t power = uint64_t{1} << kBits[rng() % 7];
  return rng() % 2 == 0 ? power : power - 1;
}

Bytes Mutate(const Bytes& base, const std::vector<Bytes>& seeds, std::mt19937_64& rng,
             size_t max_len) {
  Bytes out = base;
  auto below = [&rng](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int count = 1 + static_cast<int>(below(4));
  for (int m = 0; m < count; ++m) {
    const size_t pos = below(out.size() + 1);  // may be out.size(): append
    switch (below(7)) {
      case 0:  // flip a bit
        if (pos < out.size()) out[pos] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1: {  // insert 1 to 8 bytes: random, or one repeated
        const size_t n = 1 + below(8);
        const bool repeat = below(2) == 0;
        const uint8_t b = static_cast<uint8_t>(rng());
        for (size_t i = 0; i < n; ++i) {
          out.insert(out.begin() + pos, repeat ? b : static_cast<uint8_t>(rng()));
        }
        break;
      }
      case 2: {  // delete up to 16 bytes
        const size_t n = std::min(out.size() - std::min(pos, out.size()), 1 + below(16));
        out.erase(out.begin() + pos, out.begin() + pos + n);
        break;
      }
      case 3:  // an interesting byte
        if (pos < out.size()) out[pos] = kBytes[below(sizeof(kBytes))];
        break;
      case 4: {  // an interesting 1/2/4/8-byte integer, little- or big-endian
        const size_t width = size_t{1} << below(4);
        if (pos + width > out.size()) break;
        uint64_t v = InterestingInt(rng);
        if (below(2) == 0) v = ~v + 1;  // or its negation
        const bool big = below(2) == 0;
        for (size_t i = 0; i < width; ++i) {
          out[pos + (big ? width - 1 - i : i)] = static_cast<uint8_t>(v >> (8 * i));
        }
        break;
      }
      case 5: {  // splice: our prefix, another seed's suffix
        const Bytes& other = seeds[below(seeds.size())];
        const size_t from = below(other.size() + 1);
        out.resize(std::min(pos, out.size()));
        out.insert(out.end(), other.begin() + from, other.end());
        break;
      }
      default: {  // copy a chunk of ourselves to another place
        if (out.empty()) break;
        const size_t from = below(out.size());
        const size_t n = 1 + below(std::min<size_t>(out.size() - from, 64));
        const Bytes chunk(out.begin() + from, out.begin() + from + n);
        out.insert(out.begin() + std::min(pos, out.size()), chunk.begin(), chunk.end());
        break;
      }
    }
  }
  if (out.size() > max_len) out.resize(max_len);
  return out;
}

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--seconds=S] [--seed=N] [--max_len=B] PATH...\n", argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2;
  uint64_t seed = 1;
  size_t max_len = 8192;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    char* end = nullptr;
    if (arg.rfind("--seconds=", 0) == 0) {
      seconds = std::strtod(arg.c_str() + 10, &end);
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(arg.c_str() + 7, &end, 10);
    } else if (arg.rfind("--max_len=", 0) == 0) {
      max_len = std::strtoull(arg.c_str() + 10, &end, 10);
    } else if (arg.rfind("-", 0) == 0) {
      Usage(argv[0]);
    } else if (std::filesystem::is_directory(arg)) {
      std::vector<std::string> in_dir;
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) in_dir.push_back(entry.path().string());
      }
      std::sort(in_dir.begin(), in_dir.end());  // a fixed order: deterministic mutations
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(arg);
    }
    if (end != nullptr && *end != '\0') Usage(argv[0]);
  }
  if (files.empty()) Usage(argv[0]);

  const char* out_dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s/crash-input-%d",
                out_dir != nullptr ? out_dir : ".", static_cast<int>(::getpid()));
  InstallCrashHandlers();

  std::vector<Bytes> seeds;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz driver: cannot read %s\n", path.c_str());
      return 2;
    }
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    RunOne(seeds.back(), "seed " + path);
  }
  RunOne({}, "the empty input");

  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  std::mt19937_64 rng(seed);
  Bytes previous = seeds[0];
  int64_t runs = 0;
  while (seconds > 0 && std::chrono::steady_clock::now() < deadline) {
    // Mostly a fresh seed; sometimes stack more mutations on the previous input.
    const size_t which = static_cast<size_t>(rng() % seeds.size());
    const bool stack = rng() % 4 == 0;
    Bytes input = Mutate(stack ? previous : seeds[which], seeds, rng, max_len);
    RunOne(input, "mutation " + std::to_string(runs) + " (--seed=" + std::to_string(seed) +
                      ") of " + (stack ? "the previous mutation" : "seed " + files[which]));
    previous = std::move(input);
    ++runs;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz driver: %zu seeds and %lld mutations (--seed=%llu) in %.1f s: no crash\n",
              seeds.size(), static_cast<long long>(runs), static_cast<unsigned long long>(seed),
              elapsed);
  return 0;
}
