#include "memory/fence.h"

#include <unistd.h>

#include <cmath>
#include <ctime>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#ifdef TORCHFEED_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace torchfeed {

RingTimeoutError::RingTimeoutError(const std::string& what) : std::runtime_error(what) {}

Deadline::Deadline(const char* who, double timeout_s)
    : forever_(timeout_s < 0), seconds_(timeout_s) {
  if (std::isnan(timeout_s) || std::isinf(timeout_s) || timeout_s == 0) {
    throw std::invalid_argument(std::string(who) +
                                ": timeout must be a finite number of seconds > 0 (or None to "
                                "wait without limit), got " +
                                std::to_string(timeout_s));
  }
  if (!forever_) {
    // A year is as good as forever and keeps the time_point arithmetic far from overflow.
    const double capped = std::min(timeout_s, 365.0 * 24 * 3600);
    at_ = Clock::now() +
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(capped));
  }
}

Deadline::Clock::time_point Deadline::next_wake(std::chrono::milliseconds slice) const {
  const Clock::time_point soon = Clock::now() + slice;
  return forever_ || soon < at_ ? soon : at_;
}

void Deadline::next_wake_monotonic(std::chrono::milliseconds slice, int64_t* sec,
                                   int64_t* nsec) const {
  // steady_clock is CLOCK_MONOTONIC on Linux (libstdc++ and libc++).
  const auto since_epoch = next_wake(slice).time_since_epoch();
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  *sec = s.count();
  *nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch - s).count();
}

std::string Deadline::describe() const { return "after " + std::to_string(seconds_) + " s"; }

namespace {

// Test-only manual fences (testing/bindings.cpp): while on, a fence is held here, whatever its
// stream, until the test completes it; so the rings' release logic is tested without a GPU.
struct ManualFences {
  std::mutex mu;
  bool on = false;
  std::vector<std::function<void()>> pending;
};

ManualFences& manual_fences() {
  static ManualFences m;
  return m;
}

}  // namespace

void set_manual_fences(bool on) {
  ManualFences& m = manual_fences();
  std::lock_guard<std::mutex> guard(m.mu);
  m.on = on;
}

int64_t complete_manual_fences() {
  std::vector<std::function<void()>> done;
  {
    ManualFences& m = manual_fences();
    std::lock_guard<std::mutex> guard(m.mu);
    done.swap(m.pending);
  }
  for (auto& f : done) f();  // outside the lock: a callback may record another fence
  return static_cast<int64_t>(done.size());
}

int64_t pending_manual_fences() {
  ManualFences& m = manual_fences();
  std::lock_guard<std::mutex> guard(m.mu);
  return static_cast<int64_t>(m.pending.size());
}

void after_stream_work(const char* who, int64_t stream, int64_t device,
                       std::function<void()> done) {
  {
    ManualFences& m = manual_fences();
    std::lock_guard<std::mutex> guard(m.mu);
    if (m.on) {
      m.pending.push_back(std::move(done));
      return;
    }
  }
#ifdef TORCHFEED_WITH_CUDA
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(who) + ": cudaGetDevice failed");
  }
  // The stream belongs to `device`: queue the fence with that device current.
  if (current != device && cudaSetDevice(static_cast<int>(device)) != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(who) + ": cudaSetDevice(" + std::to_string(device) +
                             ") failed");
  }
  auto* fn = new std::function<void()>(std::move(done));
  const cudaError_t err = cudaLaunchHostFunc(
      reinterpret_cast<cudaStream_t>(stream),
      [](void* p) {
        std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(p));
        (*f)();
      },
      fn);
  if (current != device) (void)cudaSetDevice(current);
  if (err != cudaSuccess) {
    delete fn;
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(who) +
                             ": cudaLaunchHostFunc failed: " + cudaGetErrorString(err));
  }
#else
  (void)stream;
  (void)device;
  (void)done;
  throw std::invalid_argument(std::string(who) +
                              ": this build of torchfeed has no CUDA support; there is no copy "
                              "to fence");
#endif
}

int64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<int64_t>(pages) > std::numeric_limits<int64_t>::max() / page
             ? std::numeric_limits<int64_t>::max()
             : static_cast<int64_t>(pages) * page;
}

void check_arena(const char* who, int64_t capacity, int64_t alignment) {
  if (capacity <= 0) {
    throw std::invalid_argument(std::string(who) + ": capacity must be > 0 bytes, got " +
                                std::to_string(capacity));
  }
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0 || alignment > 4096) {
    throw std::invalid_argument(std::string(who) +
                                ": alignment must be a power of two in [1, 4096], got " +
                                std::to_string(alignment));
  }
  const int64_t physical = physical_memory();
  if (physical == 0) return;  // unknown: let the allocation decide
  if (capacity > physical) {
    throw std::invalid_argument(std::string(who) + ": capacity " + std::to_string(capacity) +
                                " bytes is more than this machine's physical memory (" +
                                std::to_string(physical) + " bytes)");
  }
}

}  // namespace torchfeed
